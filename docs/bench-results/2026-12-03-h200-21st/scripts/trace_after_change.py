import json,statistics as st,sys
recs=[json.loads(x) for x in open(sys.argv[1])]
# measured window: after the long 'other' step(s)
i0=max(i for i,r in enumerate(recs) if r['dt']>1.0 and not r.get('is_solo'))+1
recs=recs[i0:]
span=recs[-1]['t']+recs[-1]['dt']-recs[0]['t']
print('span',round(span,2),'steps',len(recs))
out={}
for i,r in enumerate(recs):
    if r.get('chunk_tok') or not r.get('decode_n') or i<2: continue
    p=recs[i-1]
    key=('prevpre' if p.get('chunk_tok') else 'prevsolo' if p.get('is_solo') else 'prevdec', 'rows%+d'%(r['rows']-p['rows']), 'pRows%+d'%(p['rows']-recs[i-2]['rows']))
    out.setdefault(key,[]).append(r.get('decode',0)*1e3)
for k,v in sorted(out.items(),key=lambda kv:-sum(kv[1]))[:8]:
    print(k,len(v),round(st.median(v),1),round(sum(v)/1e3,2))
pre=[r for r in recs if r.get('chunk_tok')]
print('prefill steps',len(pre),round(sum(r['dt'] for r in pre),2),'prefill part',round(sum(r.get('prefill',0) for r in pre),2),'decode part',round(sum(r.get('decode',0) for r in pre),2))
dec=[r for r in recs if not r.get('chunk_tok') and r.get('decode_n')]
print('decode-only',len(dec),round(sum(r['dt'] for r in dec),2), 'median', round(st.median(r['dt'] for r in dec)*1e3,1))

import appliance, time, sys
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import KVCache
from appliance.engine.kv import cores
model, tok = load("/work/main/appliance/embedded/tiny")
model.set_dtype(mx.float32)
def run(B, T, L, n):
    caches = [KVCache() for _ in range(6)]
    for c in caches:
        c.update_and_fetch(mx.random.normal((B,2,T,64)), mx.random.normal((B,2,T,64)))
    mx.eval([c.keys for c in caches])
    x = mx.random.randint(0, 4096, (B, L))
    res={}
    for mode in ("one","split")*3:
        cores.use(2 if mode=="split" else 1)
        ts=[]
        for _ in range(n):
            t=time.perf_counter(); y = model(x, cache=caches); mx.eval(y); ts.append(time.perf_counter()-t)
            for c in caches: c.offset -= L
        res.setdefault(mode, []).append(sorted(ts)[len(ts)//2]*1000)
    print(B,T,L, {k: " ".join("%.1f"%x for x in v) for k,v in res.items()}, flush=True)
cores.MIN_SCORES=1; cores.MIN_PREFILL=2
import appliance.engine.kv.cores as c
src = open(c.__file__).read()
# allow L>1 for the experiment
c_L = int(sys.argv[1]) if len(sys.argv)>1 else 1
orig = c._split
def patched(q,k,v,*,scale,mask=None,sinks=None,**kw):
    return orig(q,k,v,scale=scale,mask=mask,sinks=sinks,**kw)
for (B,T,L,n) in [(1,2048,512,4),(1,2048,128,8),(1,2048,16,20),(16,2048,4,10),(8,2048,1,20),(4,1024,1,20)]:
    run(B,T,L,n)

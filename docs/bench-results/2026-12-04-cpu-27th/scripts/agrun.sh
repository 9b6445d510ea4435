# $1: code dir, $2: out name
cd $1 && . /work/main/.venv/bin/activate && PYTHONPATH=$1 timeout 900 python -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet bench.anchor=${ANCHOR:-none} bench.progress=false hydra.run.dir=/tmp/agcpu/$2 2>&1 | grep -v Warning | grep BENCH
python3 -c "
import json; d=json.load(open('/tmp/agcpu/$2/bench.json')); c=d['engine']['cache']
print('$2', d['summary']['aggregate_tok_s'], d['summary']['ttft_ms_p95'], 'ram', {k:c['ram'].get(k) for k in ('bytes','entries','inserts','evictions','hits','deltas','cap_bytes')}, 'ssd', {k:c['ssd'].get(k) for k in ('bytes','writes','skipped')}, d.get('ratios'))"

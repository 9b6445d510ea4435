# Issue 13 item 9, CPU: tiered (queued bases too) against cache=ram, alternating, the appliance alone.
cd /work/main && . .venv/bin/activate
R=/tmp/cpu46; mkdir -p $R
for i in 1 2 3 4; do
for c in tiered ram; do
date -u +%H:%M:%S
appliance mode=bench bench=agents +profile=agent-fleet cache=$c bench.anchor=none bench.progress=false hydra.run.dir=$R/$c-$i 2>&1 | grep -o "agg=[0-9.]*tok/s.*ttft_p95=[0-9.]*ms"
python3 -c "import json,sys; d=json.load(open('$R/$c-$i/bench.json')); s=d['engine']['cache'].get('ssd'); print('  ssd', s and {k: s[k] for k in ('writes','bytes','skipped')})"
done
done

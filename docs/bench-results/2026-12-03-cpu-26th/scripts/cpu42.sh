# Issue 13 item 9, CPU: the SSD tier with delta blobs (67665a3) against cache=ram, alternating,
# the appliance alone; then the goal's run against mlx_lm.server.
cd /work/main && . .venv/bin/activate
R=/tmp/cpu42; mkdir -p $R
for i in 1 2 3; do
for c in tiered ram; do
date -u +%H:%M:%S
appliance mode=bench bench=agents +profile=agent-fleet cache=$c bench.anchor=none bench.progress=false hydra.run.dir=$R/$c-$i 2>&1 | grep -E "tok/s" | tail -1
python3 -c "import json,sys; d=json.load(open('$R/$c-$i/bench.json')); s=d['engine']['cache'].get('ssd'); print('  agg', d['summary']['aggregate_tok_s'], 'ssd', s and {k: s[k] for k in ('writes','bytes','skipped','hits')})"
done
done
for i in 1 2 3; do
date -u +%H:%M:%S
appliance mode=bench bench=agents +profile=agent-fleet bench.progress=false hydra.run.dir=$R/goal-$i 2>&1 | grep -E "tok/s|x " | tail -4
done
date -u +%H:%M:%S

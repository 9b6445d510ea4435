# Issue 13 item 9, CPU: the SSD tier before (6f9c68e, whole prefixes) and after (67665a3, deltas),
# alternating, the appliance alone; then five more goal runs against mlx_lm.server.
R=/tmp/cpu43; mkdir -p $R
. /work/main/.venv/bin/activate
for i in 1 2 3; do
for v in old new; do
date -u +%H:%M:%S
if [ $v = old ]; then cd /tmp/old; else cd /work/main; fi
PYTHONPATH=$PWD appliance mode=bench bench=agents +profile=agent-fleet bench.anchor=none bench.progress=false hydra.run.dir=$R/$v-$i 2>&1 | grep -E "tok/s" | tail -1 | cut -c1-200
python3 -c "import json,sys; d=json.load(open('$R/$v-$i/bench.json')); s=d['engine']['cache'].get('ssd'); print('  $v agg', d['summary']['aggregate_tok_s'], 'ssd', s and {k: s[k] for k in ('writes','bytes','skipped','hits')})"
done
done
cd /work/main
for i in 4 5 6 7 8; do
date -u +%H:%M:%S
appliance mode=bench bench=agents +profile=agent-fleet bench.progress=false hydra.run.dir=/tmp/cpu42/goal-$i 2>&1 | grep -E "^BENCH" | tail -1
done
date -u +%H:%M:%S

# Issue 13 item 9, CPU: tiered against cache=ram again, now that runs read slower (22:49-22:57).
cd /work/main && . .venv/bin/activate
R=/tmp/cpu45; mkdir -p $R
for i in 1 2 3; do
for c in tiered ram; do
date -u +%H:%M:%S
appliance mode=bench bench=agents +profile=agent-fleet cache=$c bench.anchor=none bench.progress=false hydra.run.dir=$R/$c-$i 2>&1 | grep -o "agg=[0-9.]*tok/s.*ttft_p95=[0-9.]*ms"
done
done

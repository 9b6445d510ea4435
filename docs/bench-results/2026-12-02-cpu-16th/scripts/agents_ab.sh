cd /work/main && . .venv/bin/activate
for rep in 1 2; do
for d in none lookup; do
date -u +%H:%M:%S
appliance mode=bench bench=agents +profile=agent-fleet draft=$d bench.anchor=none hydra.run.dir=/tmp/agab/$d-$rep 2>&1 | grep -v Warning | tail -6
done
done
date -u +%H:%M:%S

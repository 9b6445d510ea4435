# Issue 13 item 9, CPU: eight more goal runs against mlx_lm.server at the session's last code.
cd /work/main && . .venv/bin/activate
for i in 9 10 11 12 13 14 15 16; do
date -u +%H:%M:%S
appliance mode=bench bench=agents +profile=agent-fleet bench.progress=false hydra.run.dir=/tmp/cpu42/goal-$i 2>&1 | grep -E "^BENCH" | tail -1
done
date -u +%H:%M:%S

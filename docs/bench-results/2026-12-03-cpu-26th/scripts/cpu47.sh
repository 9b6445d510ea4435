# Issue 13 item 9, CPU: eight goal runs against mlx_lm.server at 296e88b (the session's last engine code).
cd /work/main && . .venv/bin/activate
for i in 1 2 3 4 5 6 7 8; do
date -u +%H:%M:%S
appliance mode=bench bench=agents +profile=agent-fleet bench.progress=false hydra.run.dir=/tmp/cpu47/goal-$i 2>&1 | grep -E "^BENCH" | tail -1 | grep -o 'agg=[0-9.]*tok/s\|vs mlx_lm: agg x[0-9.]* ttft_p95 x[0-9.]*' | paste - -
done
date -u +%H:%M:%S

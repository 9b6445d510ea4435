# Issue 13 item 9 on CPU at the session's code: `bench=agents +profile=agent-fleet` against
# mlx_lm.server in the same run.
. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
cd /work/main
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for i in ${ROUNDS:-1 2 3}; do
  python3 -c "$A" mode=bench bench=agents +profile=agent-fleet bench.progress=false hydra.run.dir=/tmp/cpu33/ag${TAG:-}$i 2>&1 | grep BENCH | cut -c1-300
  cp /tmp/cpu33/ag${TAG:-}$i/bench.json docs/bench-results/2026-12-04-cpu-33rd/agents-${TAG:-}$i.json
done

# Finished rows held until rows join (step.HOLD, CUDA's policy) on CPU too, against the
# CPU's default (filtered at once), the appliance alone under the agents' load, alternating.
# HOLD_ON_CPU=1 with PYTHONPATH at a devrun-only sitecustomize that sets step.HOLD = True.
. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
cd /work/main
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for i in 1 2 3; do
  for v in default hold; do
    if [ $v = hold ]; then export HOLD_ON_CPU=1; else unset HOLD_ON_CPU; fi
    PYTHONPATH=/tmp/holdcpu python3 -c "$A" mode=bench bench=agents +profile=agent-fleet bench.progress=false bench.anchor=none hydra.run.dir=/tmp/cpu33/hold-$v$i 2>&1 | grep BENCH | sed "s/^/$v$i /" | cut -c1-200
    cp /tmp/cpu33/hold-$v$i/bench.json docs/bench-results/2026-12-04-cpu-33rd/agents-hold-$v$i.json
  done
done

# With slots reused in place: the CPU's policy (a finished row held only while a row is
# prefilling or waiting to) against CUDA's (held until rows join: step.HOLD forced by a
# devrun-only sitecustomize, HOLD_ON_CPU=1), the appliance alone, alternating.
. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
cd /work/main
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for i in 1 2 3; do
  for v in policy hold; do
    if [ $v = hold ]; then export HOLD_ON_CPU=1; else unset HOLD_ON_CPU; fi
    PYTHONPATH=/tmp/holdcpu python3 -c "$A" mode=bench bench=agents +profile=agent-fleet bench.progress=false bench.anchor=none hydra.run.dir=/tmp/cpu33/hold2-$v$i 2>&1 | grep BENCH | sed "s/^/$v$i /" | cut -c1-200
    cp /tmp/cpu33/hold2-$v$i/bench.json docs/bench-results/2026-12-04-cpu-33rd/agents-hold2-$v$i.json
  done
done

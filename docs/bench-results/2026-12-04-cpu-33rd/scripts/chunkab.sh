# The CPU's derived prefill chunk (256) against 512 and 128 under the agents' load, the
# appliance alone, alternating (33rd session): 95 one-row passes of at most 256 tokens took
# 5.5 s of a 15.4 s run (ticktrace-agents-summary.txt).
. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
cd /work/main
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for i in 1 2 3; do
  for c in 256 512 128; do
    python3 -c "$A" mode=bench bench=agents +profile=agent-fleet batch.prefill_chunk=$c bench.progress=false bench.anchor=none hydra.run.dir=/tmp/cpu33/ch-$c-$i 2>&1 | grep BENCH | sed "s/^/$c-$i /" | cut -c1-200
    cp /tmp/cpu33/ch-$c-$i/bench.json docs/bench-results/2026-12-04-cpu-33rd/agents-chunk-$c-$i.json
  done
done

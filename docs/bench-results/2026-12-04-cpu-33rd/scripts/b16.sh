# Issue 12 item 9 on CPU at the session's code: B=16, 15 x 256 tokens, each method against
# draft=none (the 25th session's last CPU figures for mtp and model predate every control
# change since).
. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
cd /work/main
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for d in ${METHODS:-lookup mtp model}; do
  date -u +%H:%M:%S
  python3 -c "$A" mode=bench bench=spec draft=$d 'bench.spec_batches=[16]' bench.repeats=15 \
    bench.decode_tokens=256 bench.progress=false hydra.run.dir=/tmp/cpu33/b16-$d 2>&1 | grep -E "^edit|^free"
  cp /tmp/cpu33/b16-$d/bench.json docs/bench-results/2026-12-04-cpu-33rd/spec-$d-b16-256x15.json
done
date -u +%H:%M:%S

# Issue 12 item 9 on CPU with lookup's new default (ngram_min 1): B=1 and B=4, both workloads.
. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
cd /work/main
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
python3 -c "$A" mode=bench bench=spec draft=lookup 'bench.spec_batches=[1,4]' bench.repeats=5 \
  bench.decode_tokens=256 bench.progress=false hydra.run.dir=/tmp/cpu33/spec 2>&1 | grep -E "^edit|^free|ratio"
cp /tmp/cpu33/spec/bench.json docs/bench-results/2026-12-04-cpu-33rd/spec-lookup-b1-b4.json

# Issue 12 item 9 on CPU at B=16: 15 paired repeats of 256 tokens (as d37.sh on the H200).
cd /work/main && . .venv/bin/activate
mkdir -p /tmp/cpu37
for d in ${DRAFTS:-mtp lookup model}; do
date -u +%H:%M:%S
appliance mode=bench bench=spec draft=$d bench.spec_batches=[16] bench.repeats=15 bench.decode_tokens=256 bench.progress=false hydra.run.dir=/tmp/cpu37/$d 2>&1 | grep -v Warning | tail -4 | head -3
done
date -u +%H:%M:%S

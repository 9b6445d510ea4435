cd /work/main && . .venv/bin/activate
for d in mtp model; do
date -u +%H:%M:%S
appliance mode=bench bench=spec draft=$d 'bench.spec_batches=[16]' hydra.run.dir=/tmp/cpub/$d-final 2>&1 | grep -v Warning | tail -5
done
date -u +%H:%M:%S

cd /work/main && . .venv/bin/activate
date -u +%H:%M:%S
appliance mode=bench bench=spec draft=lookup 'bench.spec_batches=[4,16]' hydra.run.dir=/tmp/cpub/lookup-final 2>&1 | grep -v Warning | tail -7
date -u +%H:%M:%S

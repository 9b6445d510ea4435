. /work/main/.venv/bin/activate
for i in 1 2 3; do
  for v in new old; do
    if [ $v = old ]; then export PYTHONPATH=/tmp/wt_old; else unset PYTHONPATH; fi
    python -m appliance.cli mode=bench bench=spec draft=lookup 'bench.spec_batches=[16]' hydra.run.dir=/tmp/ab13/$v$i 2>&1 | grep -E "^(edit|free) " | sed "s/^/$v$i /"
  done
done

. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for i in 1 2 3; do for v in old new; do
  if [ $v = old ]; then P=/tmp/old; else P=/work/main; fi
  (cd $P && PYTHONPATH=$P python3 -c "$A" mode=bench bench=agents +profile=agent-fleet bench.progress=false bench.anchor=none hydra.run.dir=/tmp/ab/$v$i 2>&1 | grep BENCH | sed "s/^/$v$i /" | cut -c1-150)
done; done

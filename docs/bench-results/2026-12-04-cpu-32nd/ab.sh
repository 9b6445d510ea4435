. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for i in 1 2 3; do
  for v in old new; do
    if [ $v = old ]; then cd /tmp/wt29; P=/tmp/wt29; else cd /work/main; P=/work/main; fi
    PYTHONPATH=$P python3 -c "$A" mode=bench bench=agents +profile=agent-fleet bench.progress=false bench.anchor=none hydra.run.dir=/tmp/cpu32/ab-$v$i 2>&1 | grep BENCH | sed "s/^/$v$i /" | cut -c1-200
  done
done

. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
cd /work/main
for i in 1 2 3; do
  for d in none mtp; do
    appliance mode=bench bench=agents +profile=agent-fleet draft=$d bench.progress=false bench.anchor=none hydra.run.dir=/tmp/cpu32/mtpnew-$d$i 2>&1 | grep BENCH | sed "s/^/$d$i /" | cut -c1-190
  done
done

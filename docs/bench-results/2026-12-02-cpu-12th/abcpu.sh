. /work/main/.venv/bin/activate
for i in 1 2; do
 for v in head old; do
  if [ $v = old ]; then d=/tmp/wt957; else d=/work/main; fi
  (cd $d && PYTHONPATH=$d appliance mode=bench bench=agents +profile=agent-fleet bench.anchor=none hydra.run.dir=/tmp/abcpu_${v}_$i 2>&1 | grep "^BENCH" | sed "s/^/$v $i /")
 done
done

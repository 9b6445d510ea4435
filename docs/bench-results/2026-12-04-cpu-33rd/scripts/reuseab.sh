# A joining row takes a held row's slot in place, and on CPU a finished row is held while a
# row is prefilling or waiting to (new), against bd97568 (old: filtered at once, joined by
# a merge), the appliance alone under the agents' load, alternating.
. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for i in ${ROUNDS:-1 2 3}; do
  for v in old new; do
    if [ $v = old ]; then P=/tmp/wtold; else P=/work/main; fi
    cd $P
    PYTHONPATH=$P python3 -c "$A" mode=bench bench=agents +profile=agent-fleet bench.progress=false bench.anchor=none hydra.run.dir=/tmp/cpu33/reuse-$v$i 2>&1 | grep BENCH | sed "s/^/$v$i /" | cut -c1-200
    cp /tmp/cpu33/reuse-$v$i/bench.json /work/main/docs/bench-results/2026-12-04-cpu-33rd/agents-reuse-$v$i.json
  done
done

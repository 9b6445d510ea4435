# 15th session: B=16 free for mtp/model, 5 repeats; lookup free B=1, 5 repeats.
for d in mtp model; do
date -u +%H:%M:%S
timeout 120 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=spec draft=$d 'bench.spec_batches=[16]' 'bench.spec_workloads=[free]' bench.repeats=5 hydra.run.dir=/tmp/spec_$d 2>&1 | grep -v Warning | tail -3
cp /tmp/spec_$d/bench.json $OUT/spec-$d-b16-free-r5.json
done
date -u +%H:%M:%S
timeout 60 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=spec draft=lookup 'bench.spec_batches=[1]' 'bench.spec_workloads=[free]' bench.repeats=5 hydra.run.dir=/tmp/spec_lookup 2>&1 | grep -v Warning | tail -3
cp /tmp/spec_lookup/bench.json $OUT/spec-lookup-b1-free-r5.json
date -u +%H:%M:%S

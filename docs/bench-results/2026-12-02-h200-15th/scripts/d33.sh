# 15th session: bench=spec after SETTLE + pass_width. B=16 for mtp/model, all B for lookup.
A="python3 -c \"import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()\""
for d in mtp model; do
date -u +%H:%M:%S
timeout 200 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=spec draft=$d 'bench.spec_batches=[16]' hydra.run.dir=/tmp/spec_$d 2>&1 | grep -v Warning | tail -4
cp /tmp/spec_$d/bench.json $OUT/spec-$d-b16.json
done
date -u +%H:%M:%S
timeout 240 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=spec draft=lookup hydra.run.dir=/tmp/spec_lookup 2>&1 | grep -v Warning | tail -8
cp /tmp/spec_lookup/bench.json $OUT/spec-lookup.json
date -u +%H:%M:%S

# 17th session: lookup at every B, both workloads, 5 repeats (B=4 must stay >= 1.2x).
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
timeout 300 python3 -c "$A" mode=bench bench=spec draft=lookup bench.repeats=5 hydra.run.dir=/tmp/spec_lookup 2>&1 | grep -v Warning | tail -7
cp /tmp/spec_lookup/bench.json $OUT/spec-lookup-r5.json
date -u +%H:%M:%S

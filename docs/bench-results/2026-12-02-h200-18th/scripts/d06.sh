# 18th session, HEAD: lookup at every B, both workloads, 5 repeats; then the 4-bit prefill probe.
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
timeout 200 python3 -c "$A" mode=bench bench=spec draft=lookup bench.repeats=5 hydra.run.dir=/tmp/spec_lookup 2>&1 | grep -v Warning | tail -7
cp /tmp/spec_lookup/bench.json $OUT/spec-lookup-r5.json
date -u +%H:%M:%S
timeout 330 python3 devrun/prefill_q.py llama-3-8b 4 $OUT/prefill-q-8b.json 2>&1 | grep -v Warning | tail -4
date -u +%H:%M:%S

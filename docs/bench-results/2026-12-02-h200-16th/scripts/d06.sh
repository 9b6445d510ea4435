date -u +%H:%M:%S
grep -c "def carried" appliance/engine/speculate/drafters.py
timeout 150 python3 devrun/spec_trace.py 16 free $OUT/trace16-free-mtp-refs.json mtp 2 512 2>&1 | grep -v Warning | tail -9
gzip $OUT/*.json
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
timeout 200 python3 -c "$A" mode=bench bench=spec draft=mtp 'bench.spec_batches=[16]' bench.repeats=5 hydra.run.dir=/tmp/spec_mtp 2>&1 | grep -v Warning | tail -5
cp /tmp/spec_mtp/bench.json $OUT/spec-mtp-b16-r5-refs.json
date -u +%H:%M:%S

A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
date -u +%H:%M:%S
timeout 150 python3 -c "$A" mode=bench bench=spec draft=lookup 'bench.spec_batches=[1,4]' bench.repeats=9 bench.decode_tokens=256 bench.progress=false hydra.run.dir=/tmp/b14lookup 2>&1 | grep -v Warning | tail -6 | head -4
cp /tmp/b14lookup/bench.json $OUT/spec-lookup-b1-4.json
date -u +%H:%M:%S
timeout 200 python3 devrun/steptrace.py lookup 16 256 15 edit 2>&1 | grep -v Warning > $OUT/trace-lookup-edit.txt
grep -E "^run|first finish|/ none" $OUT/trace-lookup-edit.txt | cut -c1-300
date -u +%H:%M:%S

# 28th session: lookup at B=16 with the control following the rows the batch waits on
date -u +%H:%M:%S
timeout 150 python3 devrun/steptrace.py lookup 16 256 15 edit 2>&1 | grep -v Warning > $OUT/trace-lookup-edit.txt
grep -E "^run|first finish|/ none" $OUT/trace-lookup-edit.txt | cut -c1-200
date -u +%H:%M:%S
bash devrun/t4.sh "lookup mtp"
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
S="mode=bench bench=spec draft=lookup bench.spec_batches=[1,4] bench.repeats=9 bench.decode_tokens=256 bench.progress=false"
timeout 150 python3 -c "$A" $S hydra.run.dir=/tmp/sp_b14 2>&1 | grep -v Warning | tail -6 | head -5
cp /tmp/sp_b14/bench.json $OUT/spec-lookup-b1-4-256x9.json
date -u +%H:%M:%S

A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for d in ${1:-mtp}; do
date -u +%H:%M:%S
S="mode=bench bench=spec draft=$d bench.spec_batches=[16] bench.repeats=15 bench.decode_tokens=256 bench.progress=false"
timeout 220 python3 -c "$A" $S hydra.run.dir=/tmp/sp_$d 2>&1 | grep -v Warning | tail -4 | head -3
cp /tmp/sp_$d/bench.json $OUT/spec-$d-b16-256x15.json
done
date -u +%H:%M:%S

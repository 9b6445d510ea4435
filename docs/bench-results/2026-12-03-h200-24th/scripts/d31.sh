# d30.sh was docs/bench-results/2026-12-03-h200-23rd/scripts/d30-next-session.sh, run as is (16:12 UTC)
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for d in mtp model; do
S="mode=bench bench=spec draft=$d bench.spec_batches=[16] bench.repeats=7 bench.progress=false"
timeout 250 python3 -c "$A" $S hydra.run.dir=/tmp/sp_$d 2>&1 | grep -v Warning | tail -4
cp /tmp/sp_$d/bench.json $OUT/spec-$d-b16.json; date -u +%H:%M:%S
done
timeout 100 python3 devrun/plainstep.py mtp 16 512 7 2>&1 | grep -v Warning | tail -2
date -u +%H:%M:%S

# 14th session: issue 12 item 9 on the H200 (embedded model): mtp and model drafts.
for d in mtp model; do
date -u +%H:%M:%S
timeout 280 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=spec draft=$d hydra.run.dir=/tmp/spec_$d 2>&1 | grep -v Warning | tail -11
cp /tmp/spec_$d/bench.json $OUT/spec-$d.json
done
date -u +%H:%M:%S

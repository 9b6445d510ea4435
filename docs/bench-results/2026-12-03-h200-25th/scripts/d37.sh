# Issue 12 item 9 on the H200 at B=16, with runs short enough (256 tokens) for 15 repeats:
# the host's rate drifts slowly between runs (bimodal.py), so more, shorter, paired runs.
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for d in mtp model; do
date -u +%H:%M:%S
S="mode=bench bench=spec draft=$d bench.spec_batches=[16] bench.repeats=15 bench.decode_tokens=256 bench.progress=false"
timeout 210 python3 -c "$A" $S hydra.run.dir=/tmp/sp_$d 2>&1 | grep -v Warning | tail -4 | head -3
cp /tmp/sp_$d/bench.json $OUT/spec-$d-b16-256x15.json
done
date -u +%H:%M:%S
# then, in a second call: the same with 'for d in lookup'

# Run in the 25th session as d35.sh (call 1 only: its call 2 ran past its timeout); see ../../2026-12-03-h200-25th/. Issue 12 item 9 on the H200 at B=16: is a drafter's plain
# step slower than draft=none's, beyond the runs' own spread (A/A)? The 24th session read
# model (never speculating in its best runs) at 0.91-0.97x against an A/A of 1.02-1.07, and
# draft=none against itself at 0.954 (plainstep.py aa). Copy this and
# docs/bench-results/2026-12-03-cpu-23rd/scripts/plainstep.py to devrun/; run after
# install.sh, in two calls (~280 s each; a fresh machine compiles for ~60 s in the first).
# Call 1: mtp's bench with the A/A column (cut by a 150 s timeout in the 24th session), then
# plain steps alone for mtp, A/A included.
if [ "$1" = 1 ]; then
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
S="mode=bench bench=spec draft=mtp bench.spec_batches=[16] bench.repeats=7 bench.progress=false"
timeout 280 python3 -c "$A" $S hydra.run.dir=/tmp/sp_mtp 2>&1 | grep -v Warning | tail -4 | head -3
cp /tmp/sp_mtp/bench.json $OUT/spec-mtp-b16-aa.json; date -u +%H:%M:%S
timeout 150 python3 devrun/plainstep.py mtp 16 1024 9 aa 2>&1 | grep -v Warning | tail -3
date -u +%H:%M:%S
fi
# Call 2: does a longer run narrow the A/A spread? draft=model at 2048 tokens a row, 5 repeats.
if [ "$1" = 2 ]; then
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
S="mode=bench bench=spec draft=model bench.spec_batches=[16] bench.repeats=5 bench.decode_tokens=2048 bench.progress=false"
timeout 400 python3 -c "$A" $S hydra.run.dir=/tmp/sp_model_long 2>&1 | grep -v Warning | tail -4 | head -3
cp /tmp/sp_model_long/bench.json $OUT/spec-model-b16-2048-aa.json; date -u +%H:%M:%S
fi

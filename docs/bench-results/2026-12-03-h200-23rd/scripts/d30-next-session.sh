# For the next session (not run). Issue 12 item 9 on the H200: mtp at B=16 read 0.83-0.94x
# against draft=none here (23rd session), with the control speculating in 0-2 of 5 runs, so
# a plain step of the drafter's engine is slower than one of draft=none's. The drafter's
# engine keeps finished rows out of the batch (step.HOLD is off with a drafter); draft=none's
# holds them. Hypothesis: that difference, in ~1.4 s runs whose rows join and leave in
# groups. Test: the same bench with HOLD off for both (A_NOHOLD), then as shipped, 9 repeats.
# ~400 s. Copy to devrun/ and run after install.sh.
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
A_NOHOLD="import sys, appliance.engine.step as s; s.HOLD = False; from appliance.cli import main; sys.argv[0]='appliance'; main()"
S="mode=bench bench=spec draft=mtp bench.spec_batches=[16] bench.repeats=9 bench.progress=false"
timeout 190 python3 -c "$A_NOHOLD" $S hydra.run.dir=/tmp/sp_nohold 2>&1 | grep -v Warning | tail -5
cp /tmp/sp_nohold/bench.json $OUT/spec-mtp-b16-nohold.json; date -u +%H:%M:%S
timeout 190 python3 -c "$A" $S hydra.run.dir=/tmp/sp_hold 2>&1 | grep -v Warning | tail -5
cp /tmp/sp_hold/bench.json $OUT/spec-mtp-b16-hold.json; date -u +%H:%M:%S
# Then plain steps alone: draft=mtp whose control never speculates against draft=none
# (docs/bench-results/2026-12-03-cpu-23rd/scripts/plainstep.py, copied to devrun/), as shipped and with HOLD off for both.
timeout 120 python3 devrun/plainstep.py mtp 16 512 7 2>&1 | grep -v Warning | tail -2
timeout 120 python3 -c "import sys, runpy, appliance.engine.step as s; s.HOLD = False; sys.argv = ['plainstep.py', 'mtp', '16', '512', '7']; runpy.run_path('devrun/plainstep.py', run_name='__main__')" 2>&1 | grep -v Warning | tail -2
date -u +%H:%M:%S

# plainstep.py: docs/bench-results/2026-12-03-cpu-23rd/scripts/plainstep.py (its `aa` mode; run as plainstep2.py then)
date -u +%H:%M:%S
timeout 150 python3 devrun/plainstep.py model 16 1024 9 aa 2>&1 | grep -v Warning | tail -3
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
S="mode=bench bench=spec draft=lookup bench.spec_batches=[16] bench.repeats=7 bench.progress=false"
timeout 150 python3 -c "$A" $S hydra.run.dir=/tmp/sp_lookup 2>&1 | grep -v Warning | tail -4
cp /tmp/sp_lookup/bench.json $OUT/spec-lookup-b16.json; date -u +%H:%M:%S
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 0 -x tests/test_speculation.py -k "cuda_shape_policy or token_exact_with_no_draft" 2>&1 | tail -3
date -u +%H:%M:%S

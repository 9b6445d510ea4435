# 17th session, code at HEAD (warm-up Alternating, EXPLORE_AFTER): mtp and model at B=16, both workloads, 5 repeats.
date -u +%H:%M:%S; git log --oneline -1 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
timeout 290 python3 -c "$A" mode=bench bench=spec draft=mtp 'bench.spec_batches=[16]' bench.repeats=5 hydra.run.dir=/tmp/spec_mtp 2>&1 | grep -v Warning | tail -5
cp /tmp/spec_mtp/bench.json $OUT/spec-mtp-b16-r5.json
date -u +%H:%M:%S
timeout 230 python3 -c "$A" mode=bench bench=spec draft=model 'bench.spec_batches=[16]' bench.repeats=5 hydra.run.dir=/tmp/spec_model 2>&1 | grep -v Warning | tail -5
cp /tmp/spec_model/bench.json $OUT/spec-model-b16-r5.json
date -u +%H:%M:%S

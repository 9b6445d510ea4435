# 18th session, HEAD 617b20f: mtp and model at B=16, both workloads, 12 repeats (after the
# plain-step log and the one-pass rollback).
date -u +%H:%M:%S; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
timeout 280 python3 -c "$A" mode=bench bench=spec draft=mtp 'bench.spec_batches=[16]' bench.repeats=12 hydra.run.dir=/tmp/spec_mtp12 2>&1 | grep -v Warning | tail -4 | head -2
cp /tmp/spec_mtp12/bench.json $OUT/spec-mtp-b16-r12.json
date -u +%H:%M:%S
timeout 220 python3 -c "$A" mode=bench bench=spec draft=model 'bench.spec_batches=[16]' bench.repeats=12 hydra.run.dir=/tmp/spec_model12 2>&1 | grep -v Warning | tail -4 | head -2
cp /tmp/spec_model12/bench.json $OUT/spec-model-b16-r12.json
date -u +%H:%M:%S

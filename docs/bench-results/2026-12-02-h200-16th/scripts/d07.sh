# 16th session, final code: model plain vs none trace; mtp and model B=16 r5.
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
timeout 170 python3 -c "$A" mode=bench bench=spec draft=mtp 'bench.spec_batches=[16]' bench.repeats=5 hydra.run.dir=/tmp/spec_mtp 2>&1 | grep -v Warning | tail -5
cp /tmp/spec_mtp/bench.json $OUT/spec-mtp-b16-r5-final.json
date -u +%H:%M:%S
timeout 100 python3 -c "$A" mode=bench bench=spec draft=model 'bench.spec_batches=[16]' bench.repeats=5 hydra.run.dir=/tmp/spec_model 2>&1 | grep -v Warning | tail -5
cp /tmp/spec_model/bench.json $OUT/spec-model-b16-r5-final.json
date -u +%H:%M:%S
timeout 70 python3 devrun/spec_trace.py 16 free $OUT/model-plain-vs-none.json model 3 512 plain 2>&1 | grep -v "Warning\|transformers"
gzip $OUT/*.json
date -u +%H:%M:%S

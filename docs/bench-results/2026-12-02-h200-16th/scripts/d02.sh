# model at B=16 both workloads r5; then a trace of mtp free at B=16 (none/adaptive) 512 tokens
date -u +%H:%M:%S
timeout 300 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=spec draft=model 'bench.spec_batches=[16]' bench.repeats=5 hydra.run.dir=/tmp/spec_model 2>&1 | grep -v Warning | tail -6
cp /tmp/spec_model/bench.json $OUT/spec-model-b16-r5.json
date -u +%H:%M:%S

# 16th session: code b589c91 (changes 4-5 of the 15th), mtp at B=16, both workloads, 5 repeats.
date -u +%H:%M:%S; git log --oneline -1 2>/dev/null
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 500 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=spec draft=mtp 'bench.spec_batches=[16]' bench.repeats=5 hydra.run.dir=/tmp/spec_mtp 2>&1 | grep -v Warning | tail -6
cp /tmp/spec_mtp/bench.json $OUT/spec-mtp-b16-r5.json
date -u +%H:%M:%S

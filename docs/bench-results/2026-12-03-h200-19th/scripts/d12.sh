timeout 100 python3 -m pytest -q -x tests/test_kv_cuda.py -k "batched_decode or native" -p no:cacheprovider --tb=short 2>&1 | grep -v "^  /\|Warning" | tail -8
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
date -u +%H:%M:%S
timeout 200 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 bench.progress=false hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag1b/bench.json $OUT/agents-1b-b.json
date -u +%H:%M:%S
timeout 280 python3 -c "$A" mode=bench bench=spec draft=mtp 'bench.spec_batches=[16]' bench.repeats=8 bench.progress=false hydra.run.dir=/tmp/spec_mtp 2>&1 | grep -v Warning | tail -4 | head -2
cp /tmp/spec_mtp/bench.json $OUT/spec-mtp-b16-r8.json
date -u +%H:%M:%S

timeout 100 python3 -m pytest -q -x tests/test_kv_cuda.py -k batched_decode -p no:cacheprovider --tb=short 2>&1 | grep -v "^  /\|Warning" | tail -25
timeout 200 python3 devrun/attn_probe.py llama-3-8b 4 $OUT/attn-8b-kernel.json 2>&1 | grep -v Warning | tail -4
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
timeout 200 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 bench.progress=false hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag1b/bench.json $OUT/agents-1b.json
date -u +%H:%M:%S
timeout 330 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag8b/bench.json $OUT/agents-8b.json
date -u +%H:%M:%S

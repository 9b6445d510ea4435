# 14th session: item 9 on the H200, Llama-3-8B 4-bit shape, 16 x 4.
date -u +%H:%M:%S
timeout 570 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3-8b model.bits=4 model.dtype=bfloat16 bench.agents=16 bench.turns=4 hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -6
cp /tmp/ag8b/bench.json $OUT/agents-8b.json
date -u +%H:%M:%S

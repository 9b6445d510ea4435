# 14th session: item 9 on the H200, 1B, anchor at MLX defaults (after e3f9bdc), code HEAD.
A="mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5"
date -u +%H:%M:%S
timeout 300 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" $A hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -6
cp /tmp/ag1b/bench.json $OUT/agents-1b.json
date -u +%H:%M:%S

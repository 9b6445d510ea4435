# 18th session: issue 13 item 9 on the H200, Llama-3-8B 4-bit shape, 16 x 4, agent-fleet and
# nothing else: the plan now holds the 4-bit weights dense in bf16 on CUDA (model.dequantize=
# auto), and mlx_lm.server gets the same dense weights (export). Then the 1B, 16 x 5.
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
python3 -c "$A" mode=plan +profile=agent-fleet model=synthetic model.shape=llama-3-8b model.bits=4 2>&1 | grep -i "dequantize\|weights\|max_rows:" | head -6
timeout 420 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -8
cp /tmp/ag8b/bench.json $OUT/agents-8b-dense.json
date -u +%H:%M:%S
timeout 150 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -6
cp /tmp/ag1b/bench.json $OUT/agents-1b.json
date -u +%H:%M:%S

date -u +%H:%M:%S
timeout 250 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 hydra.run.dir=$OUT/fleet 2>&1 | grep -v Warning | tail -12
date -u +%H:%M:%S
timeout 300 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 hydra.run.dir=$OUT/agents1b 2>&1 | grep -v Warning | tail -10
date -u +%H:%M:%S

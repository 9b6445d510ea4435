# 21st session: the final code (as lease 3 ran it) again: 8B with anchor
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4"
timeout 235 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.progress=false hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag8b/bench.json $OUT/agents-8b.json
date -u +%H:%M:%S

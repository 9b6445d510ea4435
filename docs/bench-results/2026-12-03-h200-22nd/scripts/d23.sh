# 22nd session: item 9 with the anchor at this session's code (49a75b9): 8B 16x4, then 1B 16x5
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
timeout 260 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag8b/bench.json $OUT/agents-8b.json; date -u +%H:%M:%S
timeout 200 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b bench.agents=16 bench.turns=5 bench.progress=false hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag1b/bench.json $OUT/agents-1b.json; date -u +%H:%M:%S

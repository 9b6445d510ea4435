# The 8B against mlx_lm.server, warm, twice (item 9's figure with HOLD).
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false"
for i in 2 3; do
  timeout 230 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 hydra.run.dir=/tmp/ag8b$i 2>&1 | grep -v Warning | tail -1
  cp /tmp/ag8b$i/bench.json $OUT/agents-8b-warm$i.json; date -u +%H:%M:%S
done

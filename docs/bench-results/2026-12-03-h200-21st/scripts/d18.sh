# 21st session: the 8B agents with the fine tracer (inside the decode step), no anchor
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4"
PYTHONPATH=$PYTHONPATH:$PWD/devrun/trace APPLIANCE_FINE=1 APPLIANCE_TRACE=/tmp/tr_f timeout 170 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.anchor=none bench.progress=false hydra.run.dir=/tmp/agf 2>&1 | grep -v Warning | tail -3
cat /tmp/tr_f.*.jsonl > $OUT/tr_fine.jsonl; cp /tmp/agf/bench.json $OUT/agents-8b-fine.json
date -u +%H:%M:%S

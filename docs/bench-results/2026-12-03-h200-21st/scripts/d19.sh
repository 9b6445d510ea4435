# 21st session: re-formed buffers queued apart (rows._queue). Fine trace 8B (no anchor), 8B with anchor, 1B with anchor
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4"
PYTHONPATH=$PYTHONPATH:$PWD/devrun/trace APPLIANCE_FINE=1 APPLIANCE_TRACE=/tmp/tr_f timeout 170 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.anchor=none bench.progress=false hydra.run.dir=/tmp/agf 2>&1 | grep -v Warning | tail -1
cat /tmp/tr_f.*.jsonl > $OUT/tr_fine.jsonl; cp /tmp/agf/bench.json $OUT/agents-8b-fine.json
date -u +%H:%M:%S
timeout 260 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.progress=false hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag8b/bench.json $OUT/agents-8b.json
date -u +%H:%M:%S
M1="model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5"
timeout 170 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M1 bench.progress=false hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag1b/bench.json $OUT/agents-1b.json
date -u +%H:%M:%S

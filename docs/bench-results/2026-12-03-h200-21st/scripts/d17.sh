# 21st session: next_tokens queued at once on join/leave, filter waits for left padding only.
# 8B traced with anchor (A), 8B traced with prefill/stores async (B, no anchor), 1B with anchor
date -u +%H:%M:%S; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4"
PYTHONPATH=$PYTHONPATH:$PWD/devrun/trace APPLIANCE_TRACE=/tmp/tr_8b timeout 300 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.progress=false hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -1
cat /tmp/tr_8b.*.jsonl > $OUT/tr_8b.jsonl; cp /tmp/ag8b/bench.json $OUT/agents-8b.json
python3 devrun/trace_sum.py $OUT/tr_8b.jsonl 2>/dev/null | head -4
date -u +%H:%M:%S
PYTHONPATH=$PYTHONPATH:$PWD/devrun/trace APPLIANCE_EXP=async APPLIANCE_TRACE=/tmp/tr_8bx timeout 150 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.anchor=none bench.progress=false hydra.run.dir=/tmp/ag8bx 2>&1 | grep -v Warning | tail -1
cat /tmp/tr_8bx.*.jsonl > $OUT/tr_8b_async.jsonl; cp /tmp/ag8bx/bench.json $OUT/agents-8b-async.json
python3 devrun/trace_sum.py $OUT/tr_8b_async.jsonl 2>/dev/null | head -4
date -u +%H:%M:%S
M1="model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5"
timeout 200 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M1 bench.progress=false hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag1b/bench.json $OUT/agents-1b.json
date -u +%H:%M:%S

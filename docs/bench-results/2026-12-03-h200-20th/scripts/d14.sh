# For the 20th session: where the 8B agents' time goes with the masked decode kernels (b079d4b):
# a traced run (anchor none), then the same against mlx_lm.server; then the 1B again.
date -u +%H:%M:%S; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4"
PYTHONPATH=$PYTHONPATH:$PWD/devrun/trace APPLIANCE_TRACE=/tmp/tr_8b timeout 240 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.anchor=none bench.progress=false hydra.run.dir=/tmp/ag_tr8b 2>&1 | grep -v Warning | tail -1
cat /tmp/tr_8b.*.jsonl > $OUT/tr_8b.jsonl; cp /tmp/ag_tr8b/bench.json $OUT/agents-trace-8b.json
python3 devrun/trace_sum.py $OUT/tr_8b.jsonl 2>/dev/null | head -12
date -u +%H:%M:%S
timeout 300 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.progress=false hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag8b/bench.json $OUT/agents-8b.json
date -u +%H:%M:%S

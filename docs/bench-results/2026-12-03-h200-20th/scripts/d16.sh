# 20th session: one wait per filter (not one a layer); kernels' tests, then 8B (traced, with the anchor), then 1B
date -u +%H:%M:%S; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 150 python3 -m pytest -q tests/test_kv_cuda.py -p no:cacheprovider 2>&1 | tail -2
date -u +%H:%M:%S
timeout 120 python3 devrun/probe_bias.py llama-3-8b 4 $OUT/probe_bias_8b.json 2>&1 | grep -v Warning
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4"
PYTHONPATH=$PYTHONPATH:$PWD/devrun/trace APPLIANCE_TRACE=/tmp/tr_8b timeout 300 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.progress=false hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -1
cat /tmp/tr_8b.*.jsonl > $OUT/tr_8b.jsonl; cp /tmp/ag8b/bench.json $OUT/agents-8b.json
python3 devrun/trace_sum.py $OUT/tr_8b.jsonl 2>/dev/null | head -4
date -u +%H:%M:%S
M1="model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5"
timeout 240 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M1 bench.progress=false hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag1b/bench.json $OUT/agents-1b.json
date -u +%H:%M:%S

date -u +%H:%M:%S
timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_prefix_cache.py -k "lone_rows" 2>&1 | tail -2
date -u +%H:%M:%S
timeout 330 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -7
cp /tmp/ag1b/bench.json $OUT/agents1b_anchor.json
date -u +%H:%M:%S

date -u +%H:%M:%S
timeout 560 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3-8b model.bits=4 model.dtype=bfloat16 bench.agents=16 bench.turns=4 hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -7
cp /tmp/ag8b/bench.json $OUT/agents8b_anchor.json
date -u +%H:%M:%S
timeout 60 python3 -m pytest -q -x -p no:cacheprovider tests/test_prefix_cache.py -k "lone_rows" 2>&1 | grep -E "^E|^>|FAILED" | head -12
date -u +%H:%M:%S

date -u +%H:%M:%S
timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/test_prefix_cache.py -k "lone_rows or token_exact or agents_arriving" 2>&1 | tail -4
date -u +%H:%M:%S
timeout 120 python3 devrun/decode_ab.py $OUT/decode_ab.json 16 2048 2>&1 | grep -v Warn | tail -4
date -u +%H:%M:%S
mkdir -p $OUT/ph
PHASE_LOG=$OUT/ph/ph PYTHONPATH=$PWD/devrun/prof_site:$PYTHONPATH timeout 200 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet bench.anchor=none model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 hydra.run.dir=/tmp/agents1b 2>&1 | grep -v Warning | tail -4
cp /tmp/agents1b/bench.json $OUT/agents1b_self.json 2>/dev/null
find $OUT/ph -empty -delete
python3 devrun/phases.py $OUT/ph/*
date -u +%H:%M:%S

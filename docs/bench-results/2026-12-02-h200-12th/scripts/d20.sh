date -u +%H:%M:%S
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
timeout 200 python3 devrun/shape_cost.py $OUT/shape.json 2>&1 | grep -v Warning | tail -40
date -u +%H:%M:%S
mkdir -p $OUT/ph
PHASE_LOG=$OUT/ph/ph PYTHONPATH=$PWD/devrun/prof_site:$PYTHONPATH timeout 300 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet bench.anchor=none model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 hydra.run.dir=/tmp/agents1b 2>&1 | grep -v Warning | tail -6
cp /tmp/agents1b/bench.json $OUT/agents1b.json 2>/dev/null
find $OUT/ph -empty -delete
python3 devrun/phases.py $OUT/ph/*
date -u +%H:%M:%S

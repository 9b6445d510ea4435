# For the next session (not run): the 8B agents' steps are encoding-bound on the host
# (21st session). A/B, appliance alone, the fine tracer on: batch.compile_step=true (fewer
# kernels a step) and MLX_MAX_OPS_PER_BUFFER=200 (fewer, larger CUDA graphs) against the
# default, in one lease; then the best with the anchor. ~420 s. Needs devrun/trace/ (this
# session's scripts/trace_sitecustomize.py as devrun/trace/sitecustomize.py).
# Tests on the device: `python3 -m pytest -n 0 ...` (pyproject runs one worker a core since
# f9c93aa: 16 workers would share the one GPU; .device/a carries the pytest-xdist wheels).
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.anchor=none bench.progress=false"
T="PYTHONPATH=$PYTHONPATH:$PWD/devrun/trace APPLIANCE_FINE=1"
env $T APPLIANCE_TRACE=/tmp/tr_def timeout 130 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 hydra.run.dir=/tmp/a_def 2>&1 | grep -v Warning | tail -1
env $T APPLIANCE_TRACE=/tmp/tr_cmp timeout 130 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 batch.compile_step=true hydra.run.dir=/tmp/a_cmp 2>&1 | grep -v Warning | tail -1
env $T MLX_MAX_OPS_PER_BUFFER=200 APPLIANCE_TRACE=/tmp/tr_ops timeout 130 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 hydra.run.dir=/tmp/a_ops 2>&1 | grep -v Warning | tail -1
for x in def cmp ops; do cat /tmp/tr_$x.*.jsonl > $OUT/tr_$x.jsonl; cp /tmp/a_$x/bench.json $OUT/agents-8b-$x.json; done
python3 docs/bench-results/2026-12-03-h200-21st/scripts/trace_categories.py $OUT/tr_def.jsonl $OUT/tr_cmp.jsonl $OUT/tr_ops.jsonl
date -u +%H:%M:%S

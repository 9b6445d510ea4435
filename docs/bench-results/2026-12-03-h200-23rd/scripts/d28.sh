date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false"
timeout 260 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 hydra.run.dir=/tmp/ag8b1 2>&1 | grep -v Warning | tail -1
cp /tmp/ag8b1/bench.json $OUT/agents-8b-first.json; date -u +%H:%M:%S
K="test_compiled_step_matches_batch_generator or test_cuda_shape_policy_matches_batch_generator"
PYTHONPATH=$PYTHONPATH:$PWD/devrun/nohold timeout 60 python3 -m pytest -n 0 -q -p no:cacheprovider -p noholdplug tests/test_batch_parity.py -k "$K" -rf 2>&1 | grep -E "^FAILED|passed|failed" | head -20
echo "== HOLD on"
timeout 60 python3 -m pytest -n 0 -q -p no:cacheprovider tests/test_batch_parity.py -k "$K" -rf 2>&1 | grep -E "^FAILED|passed|failed|^E " | head -30
date -u +%H:%M:%S

# 22nd session: c9e3944 on CUDA (HOLD on): 8B agents alone, traced (the lease's second 8B run); then the HOLD tests
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.anchor=none bench.progress=false"
env PYTHONPATH=$PYTHONPATH:$PWD/devrun/trace APPLIANCE_FINE=1 APPLIANCE_TRACE=/tmp/tr_hold timeout 125 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 hydra.run.dir=/tmp/a_hold 2>&1 | grep -v Warning | tail -1
cat /tmp/tr_hold.*.jsonl > $OUT/tr_hold.jsonl; cp /tmp/a_hold/bench.json $OUT/agents-8b-hold.json
python3 docs/bench-results/2026-12-03-h200-21st/scripts/trace_categories.py $OUT/tr_hold.jsonl
date -u +%H:%M:%S
timeout 70 python3 -m pytest -n 0 -q -p no:cacheprovider tests/test_batch_parity.py tests/test_batching.py -k "held or admission_waits or matches_batch_generator" 2>&1 | tail -3
date -u +%H:%M:%S

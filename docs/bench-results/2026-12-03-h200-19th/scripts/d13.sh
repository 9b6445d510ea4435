date -u +%H:%M:%S
timeout 120 python3 -m pytest -q -x tests/test_kv_cuda.py -k "batched_decode or native" -p no:cacheprovider --tb=short 2>&1 | grep -v "^  /\|Warning" | tail -6 | tee $OUT/pytest.txt
grep -q " passed" $OUT/pytest.txt && ! grep -q "failed\|error" $OUT/pytest.txt || exit 5
timeout 100 python3 devrun/attn_probe.py llama-3-8b 4 $OUT/attn-8b-kernel-u4.json 2>&1 | grep -v Warning | tail -4
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
timeout 200 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false hydra.run.dir=/tmp/ag8b 2>&1 | grep -v Warning | tail -1
cp /tmp/ag8b/bench.json $OUT/agents-8b-u4.json
date -u +%H:%M:%S

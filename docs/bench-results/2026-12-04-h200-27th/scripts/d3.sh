A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
HYDRA_FULL_ERROR=1 timeout 200 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 bench.progress=false hydra.run.dir=/tmp/agx > $OUT/agx.log 2>&1
grep -v Warning $OUT/agx.log | tail -40
cp /tmp/agx/bench.json $OUT/agents-1b-x.json && RUNS="${RUNS:-8b:1 1b:2}" bash devrun/d2.sh

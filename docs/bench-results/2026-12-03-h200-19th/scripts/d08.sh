# 19th session: where the agents' time goes on the H200 (engine step trace), SSD tier on/off.
date -u +%H:%M:%S; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
export PYTHONPATH=$PYTHONPATH:$PWD/devrun/trace
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
run() { n=$1; T=$2; shift 2
  APPLIANCE_TRACE=/tmp/tr_$n timeout $T python3 -c "$A" mode=bench bench=agents +profile=agent-fleet "$@" bench.anchor=none bench.progress=false hydra.run.dir=/tmp/ag_$n 2>&1 | grep -v Warning | tail -1
  cp /tmp/ag_$n/bench.json $OUT/$n.json; cat /tmp/tr_$n.*.jsonl > $OUT/tr_$n.jsonl
  python3 devrun/trace_sum.py $OUT/tr_$n.jsonl | head -11; date -u +%H:%M:%S; }
M1="model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4"
run 1b_tiered 150 $M1
run 1b_ram 150 $M1 cache=ram
run 8b_tiered 240 $M8
run 8b_ram 240 $M8 cache=ram

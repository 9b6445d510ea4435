# 22nd session: 8B agents, appliance alone, fine tracer: default (80 ops a CUDA graph) vs 200 ops vs no CUDA graphs vs compile_step
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.anchor=none bench.progress=false"
T="PYTHONPATH=$PYTHONPATH:$PWD/devrun/trace APPLIANCE_FINE=1"
run() {  # name, env..., -- overrides...
  n=$1; shift; e=(); while [ "$1" != "--" ]; do e+=("$1"); shift; done; shift
  env $T "${e[@]}" APPLIANCE_TRACE=/tmp/tr_$n timeout 125 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 "$@" hydra.run.dir=/tmp/a_$n 2>&1 | grep -v Warning | tail -1
  cat /tmp/tr_$n.*.jsonl > $OUT/tr_$n.jsonl; cp /tmp/a_$n/bench.json $OUT/agents-8b-$n.json; date -u +%H:%M:%S
}
run def X=1 --
run ops X=1 MLX_MAX_OPS_PER_BUFFER=200 --
run nog MLX_USE_CUDA_GRAPHS=0 --
run cmp X=1 -- batch.compile_step=true
python3 docs/bench-results/2026-12-03-h200-21st/scripts/trace_categories.py $OUT/tr_def.jsonl $OUT/tr_ops.jsonl $OUT/tr_nog.jsonl $OUT/tr_cmp.jsonl

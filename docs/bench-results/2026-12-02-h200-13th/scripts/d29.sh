# 13th session: MLX_MAX_OPS_PER_BUFFER (kernels per CUDA graph; MLX's default 20) A/B, graph cache 4096.
export PYTHONPATH=$PWD/devrun/prof_site:$PYTHONPATH
A="mode=bench bench=agents +profile=agent-fleet bench.anchor=none model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5"
for ops in 80 20; do
  date -u +%H:%M:%S
  MLX_MAX_OPS_PER_BUFFER=$ops REPS=1 SPREAD=1500 BS=1,8,16 timeout 60 python3 devrun/decode_b.py $OUT/decode_ops$ops.json 2>&1 | grep "^{"
  MLX_MAX_OPS_PER_BUFFER=$ops PHASE_LOG=/tmp/ph_o$ops timeout 100 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" $A hydra.run.dir=/tmp/ag_o$ops 2>&1 | grep "^BENCH" | tail -2
  cp /tmp/ag_o$ops/bench.json $OUT/ag_ops$ops.json
  for f in /tmp/ph_o$ops.*; do [ -s $f ] && python3 devrun/phases.py $f > $OUT/phases_ops$ops.txt; done
  grep "decode B\|last 16" $OUT/phases_ops$ops.txt
done
date -u +%H:%M:%S

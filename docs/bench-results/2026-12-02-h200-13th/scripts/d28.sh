# 13th session: MLX_CUDA_GRAPH_CACHE_SIZE A/B under the agents load (1B), then the full anchor run.
export PYTHONPATH=$PWD/devrun/prof_site:$PYTHONPATH
A="mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5"
run() {  # name graph_cache [extra]
  date -u +%H:%M:%S
  (nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/smi_$1.txt) & smi=$!
  MLX_CUDA_GRAPH_CACHE_SIZE=$2 PHASE_LOG=/tmp/ph_$1 timeout 250 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" $A $3 hydra.run.dir=/tmp/ag_$1 2>&1 | grep "^BENCH\|^contender\|^mlx\|^appl" | tail -4
  kill $smi
  echo "smi max MiB: $(sort -n /tmp/smi_$1.txt | tail -1)"
  cp /tmp/ag_$1/bench.json $OUT/ag_$1.json
  for f in /tmp/ph_$1.*; do [ -s $f ] && python3 devrun/phases.py $f > $OUT/phases_$1.txt; done
  grep "decode B\|last 16" $OUT/phases_$1.txt
}
run g4096 4096 bench.anchor=none
run g100 100 bench.anchor=none
run g4096b 4096 bench.anchor=none
unset MLX_CUDA_GRAPH_CACHE_SIZE
date -u +%H:%M:%S
timeout 250 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" $A hydra.run.dir=/tmp/ag_full 2>&1 | grep -v Warning | tail -5
cp /tmp/ag_full/bench.json $OUT/ag_full.json
date -u +%H:%M:%S

# 13th session: what stretches decode steps under the agents load (1B, appliance alone).
# Variants: baseline, SWITCH=0.5ms, cache=ram (no SSD writer), compile_step, baseline again.
export PYTHONPATH=$PWD/devrun/prof_site:$PYTHONPATH
run() {  # name, env..., -- overrides...
  name=$1; shift
  date -u +%H:%M:%S
  env PHASE_LOG=/tmp/ph_$name "$@" timeout 110 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet bench.anchor=none model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 hydra.run.dir=/tmp/ag_$name $EXTRA 2>&1 | grep "^BENCH\|rror" | tail -3
  cp /tmp/ag_$name/bench.json $OUT/ag_$name.json
  for f in /tmp/ph_$name.*; do [ -s $f ] && python3 devrun/phases.py $f > $OUT/phases_$name.txt; done
  tail -4 $OUT/phases_$name.txt
}
EXTRA= run base
EXTRA= run switch SWITCH=0.0005
EXTRA="cache=ram" run ram
EXTRA="batch.compile_step=true" run compiled
EXTRA= run base2
date -u +%H:%M:%S

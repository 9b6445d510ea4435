# Issue 13 item 9 on the H200 at the session's code: agents vs mlx_lm.server, 1B bf16 16x5 then 8B 4-bit 16x4.
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M1="model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 bench.progress=false"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false"
for r in ${RUNS:-1b:1 8b:1}; do
  s=${r%%:*}; i=${r##*:}; date -u +%H:%M:%S
  if [ $s = 1b ]; then M=$M1; else M=$M8; fi
  timeout 260 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M hydra.run.dir=/tmp/ag$s$i 2>&1 | grep -v Warning | tail -1
  cp /tmp/ag$s$i/bench.json $OUT/agents-$s-$i.json
  python3 -c "import json,sys; d=json.load(open('/tmp/ag$s$i/bench.json')); print('$s$i', d['ratios'], d['summary']['errors'], d['anchor']['summary']['errors'], d['summary']['aggregate_tok_s'], d['anchor']['summary']['aggregate_tok_s'], d['engine']['cache'].get('ssd'))"
done
date -u +%H:%M:%S

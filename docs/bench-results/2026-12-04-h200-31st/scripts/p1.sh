date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false"
PY=$(ls /tmp/site/bin/py-spy 2>/dev/null || command -v py-spy)
timeout 280 $PY record --subprocesses --idle -r 100 --format raw -o /tmp/prof-8b.txt -- \
  python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.anchor=none \
  hydra.run.dir=/tmp/prof8b 2>&1 | grep -v Warning | tail -2
gzip -9 -c /tmp/prof-8b.txt > $OUT/prof-8b.txt.gz; ls -la $OUT
cp /tmp/prof8b/bench.json $OUT/agents-8b-alone-prof2.json
date -u +%H:%M:%S

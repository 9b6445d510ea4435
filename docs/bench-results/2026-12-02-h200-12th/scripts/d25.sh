date -u +%H:%M:%S
python3 -c "import httptools, uvloop; print('httptools', httptools.__version__, 'uvloop', uvloop.__version__)"
timeout 250 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -6
cp /tmp/ag1b/bench.json $OUT/agents1b_anchor.json
date -u +%H:%M:%S
(timeout 100 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet bench.anchor=none model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 hydra.run.dir=/tmp/agspy 2>&1 | grep "^BENCH") &
for i in $(seq 60); do pid=$(pgrep -f "appliance.cli.*mode=serve" | head -1); [ -n "$pid" ] && break; sleep 1; done
port=$(tr '\0' ' ' < /proc/$pid/cmdline | grep -o "server.port=[0-9]*" | cut -d= -f2)
for i in $(seq 120); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
sleep 5
/tmp/site/bin/py-spy record -p $pid -d 12 -r 250 --threads --gil -f raw -o $OUT/spy_gil.txt >/dev/null 2>&1
wait
date -u +%H:%M:%S

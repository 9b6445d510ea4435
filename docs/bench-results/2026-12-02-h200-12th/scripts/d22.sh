date -u +%H:%M:%S
timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/test_prefix_cache.py -k "lone_rows_pass_runs" 2>&1 | grep -E "^E|assert" | head -12
date -u +%H:%M:%S
(timeout 200 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet bench.anchor=none model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 hydra.run.dir=/tmp/agspy 2>&1 | grep -v Warning | tail -2) &
for i in $(seq 60); do pid=$(pgrep -f "appliance.cli.*mode=serve" | head -1); [ -n "$pid" ] && break; sleep 1; done
port=$(tr '\0' ' ' < /proc/$pid/cmdline | grep -o "server.port=[0-9]*" | cut -d= -f2)
echo pid=$pid port=$port
for i in $(seq 120); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
date -u +%H:%M:%S; sleep 5
/tmp/site/bin/py-spy record -p $pid -d 14 -r 250 --threads --gil -f raw -o $OUT/spy_gil.txt >/dev/null 2>&1 || python3 -m py_spy record -p $pid -d 14 -r 250 --threads --gil -f raw -o $OUT/spy_gil.txt
date -u +%H:%M:%S
wait
ls -la $OUT
timeout 330 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=agents +profile=agent-fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5 hydra.run.dir=/tmp/ag1b 2>&1 | grep -v Warning | tail -8
cp /tmp/ag1b/bench.json $OUT/agents1b_anchor.json
date -u +%H:%M:%S

# 13th session: split a loaded decode step into graph building, async_eval and eval waits; py-spy native.
export PYTHONPATH=$PWD/devrun/prof_site:$PYTHONPATH
A="mode=bench bench=agents +profile=agent-fleet bench.anchor=none model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.agents=16 bench.turns=5"
date -u +%H:%M:%S
PHASE_LOG=/tmp/ph_ev timeout 110 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" $A hydra.run.dir=/tmp/ag_ev 2>&1 | grep "^BENCH" | tail -2
for f in /tmp/ph_ev.*; do [ -s $f ] && python3 devrun/phases.py $f > $OUT/phases_ev.txt; done
cat $OUT/phases_ev.txt | grep -v "^  prefill"
date -u +%H:%M:%S
(timeout 110 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" $A hydra.run.dir=/tmp/agspy 2>&1 | grep "^BENCH") &
for i in $(seq 60); do pid=$(pgrep -f "appliance.cli.*mode=serve" | head -1); [ -n "$pid" ] && break; sleep 1; done
port=$(tr '\0' ' ' < /proc/$pid/cmdline | grep -o "server.port=[0-9]*" | cut -d= -f2)
for i in $(seq 120); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
sleep 6
/tmp/site/bin/py-spy record -p $pid -d 10 -r 200 --threads --native -f raw -o $OUT/spy_native.txt >/dev/null 2>&1
wait
ls -la $OUT
date -u +%H:%M:%S

# 45th session: the plan and two agents runs after the CUDA memory fix (machine.py reads total_memory).
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
python3 -c "from appliance.plan.machine import detect; print(detect())"
timeout 60 python3 -c "$A" mode=plan +profile=agent-fleet model=synthetic model.shape=llama-3-8b model.bits=4 2>&1 | grep -iv warning | grep -i "memory\|ceiling\|rows\|budget\|ram\|context\|chunk" | head -20
RUNS="8b:9 1b:7" bash devrun/d2.sh

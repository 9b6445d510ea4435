date -u +%H:%M:%S
nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,power.draw,pstate --format=csv
nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null; lscpu | grep -E "Model name|NUMA node|Socket"
timeout 200 python3 devrun/bimodal.py 16 512 16 2>&1 | grep -v Warning
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,pstate --format=csv
date -u +%H:%M:%S
echo pinned to cpu 3
timeout 150 taskset -c 3 python3 devrun/bimodal.py 16 512 16 2>&1 | grep -v Warning
date -u +%H:%M:%S

date -u +%H:%M:%S; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 200 python3 devrun/probe_b.py llama-3-8b 4 $OUT/probe_b_8b.json 2>&1 | grep -v Warning
date -u +%H:%M:%S
MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 devrun/probe_b.py llama-3-8b 4 $OUT/probe_b_8b_nographs.json 2>&1 | grep -v Warning
date -u +%H:%M:%S

# 17th session: every method's verify cost on the Llama-3.2-1B shape (bf16, random weights).
date -u +%H:%M:%S
timeout 400 python3 devrun/verify_cost.py llama-3.2-1b bfloat16 $OUT 1,4,16 2>&1 | grep -v "Warning\|transformers" | grep -v "^free\|^workload\|^(ratio"
date -u +%H:%M:%S

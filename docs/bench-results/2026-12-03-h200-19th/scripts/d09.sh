date -u +%H:%M:%S
timeout 200 python3 devrun/attn_probe.py llama-3.2-1b 0 $OUT/attn-1b.json 2>&1 | grep -v Warning | tail -5
date -u +%H:%M:%S
timeout 300 python3 devrun/attn_probe.py llama-3-8b 4 $OUT/attn-8b.json 2>&1 | grep -v Warning | tail -5
date -u +%H:%M:%S

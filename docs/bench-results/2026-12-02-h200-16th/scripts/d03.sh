date -u +%H:%M:%S
timeout 280 python3 devrun/spec_trace.py 16 free $OUT/trace16-free-mtp.json mtp 2 512 2>&1 | grep -v Warning | tail -12
gzip $OUT/*.json
date -u +%H:%M:%S

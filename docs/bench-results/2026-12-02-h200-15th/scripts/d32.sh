# 15th session: the settled-timing change, B=16 free trace, then bench=spec B=16 mtp/model/lookup.
date -u +%H:%M:%S
timeout 250 python3 devrun/spec_trace.py 16 free $OUT/trace16-settle.json mtp,model 2>&1 | grep -v Warn | tail -14
date -u +%H:%M:%S

# The 41st session's script for the next device session (copy as devrun/next-session.sh; the
# 40th's as devrun/next-session-40th.sh, which runs 16 and hands 1-15 to the 39th's, copied
# as devrun/next-session-39th.sh with ../../2026-12-05-cpu-39th/scripts/kvstart.py; plus
# ../../2026-12-04-h200-27th/scripts/d2.sh, ../../2026-12-03-h200-26th/scripts/t4.sh and
# ../../2026-12-05-h100-40th/scripts/probetrace.py into devrun/).
# 41st (H100 again): 1B 2.06x and two runs void (mlx_lm.server's generation thread died),
# 8B 1.79x, 1.81x; model at B=16 free over 31 repeats 0.93 paired: its 15 runs with a
# speculative step 0.87, the 16 without 0.98; a host's slow spell had flipped the CUDA
# control onto speculation's stale time (fixed in 5e5cd59, checked on CPU only).
# Next: part 17 first (the fix on a device), then RUNS="1b:1 1b:2" d2.sh and "8b:4 8b:5".
case $1 in [1-9]|1[0-6]) exec bash devrun/next-session-40th.sh "$1" ;; esac
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
case $1 in
17) # issue 12 item 9 after 5e5cd59: model and mtp at B=16, free code, 31 repeats each
    for d in ${DRAFTS:-model mtp}; do
      timeout 280 python3 -c "$A" mode=bench bench=spec draft=$d bench.spec_batches=[16] \
        bench.spec_workloads=[free] bench.repeats=31 bench.decode_tokens=256 \
        bench.progress=false hydra.run.dir=/tmp/sp31$d 2>&1 | grep -v Warning | tail -4 | head -3
      cp /tmp/sp31$d/bench.json $OUT/spec-$d-b16-free-256x31.json
      python3 -c "
import json, statistics as st
c = json.load(open('/tmp/sp31$d/bench.json'))['result']['cells'][0]
n, m, acc = c['none']['runs_tok_s'], c['$d']['runs_tok_s'], c['$d']['runs_accepted']
s = [y / x for x, y, a in zip(n, m, acc) if a]; p = [y / x for x, y, a in zip(n, m, acc) if not a]
print('$d runs with speculation', len(s), s and round(st.median(s), 3), 'without', len(p), p and round(st.median(p), 3))"
    done ;;
esac
date -u +%H:%M:%S

# d35.sh was docs/bench-results/2026-12-03-h200-24th/scripts/d35-next-session.sh, run as is
# (19:07 UTC: call 1 gave d35-1.txt; call 2 ran past its 400 s timeout). plainstep.py: the
# 23rd session's (docs/bench-results/2026-12-03-cpu-23rd/scripts/plainstep.py).

# For the next session (not run). Issue 12 item 9 on the H200: the whole bench read 0.943-0.945
# in two cells (mtp free, model free), where the runs with a probe lost 12-19%. How much of
# that would spacing probes better save? probecost.py adds a drafter engine whose control
# never probes again once speculation lost. Copy probecost.py (beside this) to devrun/; run
# after install.sh, one call each (~150-250 s; a fresh machine compiles for ~60 s first).
date -u +%H:%M:%S
timeout 280 python3 devrun/probecost.py ${1:-mtp} 16 256 15 free 2>&1 | grep -v Warning | tail -6
date -u +%H:%M:%S

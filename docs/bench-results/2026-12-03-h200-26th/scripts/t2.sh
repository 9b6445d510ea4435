date -u +%H:%M:%S
timeout 250 python3 devrun/steptrace.py model 16 256 15 free 2>&1 | grep -v Warning > $OUT/trace2-model.txt
grep -c . $OUT/trace2-model.txt; grep -v '^    ' $OUT/trace2-model.txt | cut -c1-200
date -u +%H:%M:%S

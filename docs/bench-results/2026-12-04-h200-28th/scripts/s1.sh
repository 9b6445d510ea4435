date -u +%H:%M:%S
git log --oneline -1 | cat
timeout 200 python3 devrun/steptrace.py lookup 16 256 15 edit 2>&1 | grep -v Warning > $OUT/trace-lookup-edit.txt
grep -E "^run|first finish|/ none" $OUT/trace-lookup-edit.txt | cut -c1-260
date -u +%H:%M:%S
timeout 150 python3 devrun/steptrace.py lookup 16 256 9 free 2>&1 | grep -v Warning > $OUT/trace-lookup-free.txt
grep -E "/ none" $OUT/trace-lookup-free.txt
date -u +%H:%M:%S
bash devrun/t4.sh lookup

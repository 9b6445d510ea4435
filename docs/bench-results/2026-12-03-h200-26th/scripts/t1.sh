for d in model mtp; do
date -u +%H:%M:%S
timeout 200 python3 devrun/steptrace.py $d 16 256 15 free 2>&1 | grep -v Warning | tee $OUT/trace-$d.txt | cut -c1-900
done
date -u +%H:%M:%S

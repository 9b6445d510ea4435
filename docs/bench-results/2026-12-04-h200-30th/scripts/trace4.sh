# mtp at B=4 (free) read paired 0.91 at 9f9f064 with acceptances in 7 of 9 runs: where do its
# speculative steps come from, and what do they cost?
date -u +%H:%M:%S
timeout 200 python3 devrun/steptrace.py mtp 4 256 9 free > $OUT/trace-mtp-b4.txt 2>&1
grep -E "^run|paired" $OUT/trace-mtp-b4.txt | cut -c1-400
date -u +%H:%M:%S

# The 40th session's script for the next device session (copy as devrun/next-session.sh; the
# 39th's as devrun/next-session-39th.sh, which runs 15 and hands 1-14 to the 37th's).
# 40th (H100): part 15 passed; agents 1B 1.95x, 1.83x, 8B 1.48x (the machine's first 8B run),
# 1.79x, 1.59x; part 16 (below) split a later probe's first step: the MTP head's catch-up at
# a new buffer shape (93 ms once, 6 ms after), the verify 6 ms.
# Next, on an H200 (the issues' goals name it): RUNS="1b:1 1b:2" d2.sh, then "8b:4 8b:5";
# part 3 (B=16 model, mtp: t4.sh); part 16 once to see the catch-up's first-shape cost there.
case $1 in [1-9]|1[0-5]) exec bash devrun/next-session-39th.sh "$1" ;; esac
date -u +%H:%M:%S
case $1 in
16) SPLIT=1 FORCE=3:60,5:120,7:180 timeout 250 python3 devrun/probetrace.py mtp 16 256 9 free \
      > $OUT/probesplit-mtp-b16-free.txt 2>&1
    grep -E "^run|forced|paired|split|traces" $OUT/probesplit-mtp-b16-free.txt | cut -c1-400 ;;
esac
date -u +%H:%M:%S

# The 43rd session's script for the next device session: part 18 only (issue 13 item 9; part 17,
# issue 12's B=16 cell, ran in the 43rd). Copy as devrun/next-session.sh; this folder's
# next-session-41st.sh as devrun/next-session-41st.sh (DRAFTS= picks part 17's drafts) and, as
# its header says, the 40th's, 39th's and their scripts into devrun/.
# Order: part 18 "1b:1 1b:2", then "8b:4 8b:5" (agents vs mlx_lm.server; it keeps
# mlx_lm.server's log and traceback where its generation thread dies).
case $1 in [1-9]|1[0-7]) exec bash devrun/next-session-41st.sh "$1" ;; esac
date -u +%H:%M:%S
case $1 in
18) # agents vs mlx_lm.server (devrun/d2.sh), and why mlx_lm.server's generation thread died
    # where it does (3 of 6 1B runs on the H100): its log's traceback, which no run kept
    RUNS="$2" bash devrun/d2.sh
    for r in $2; do
      f=/tmp/ag${r%%:*}${r##*:}/mlx_lm_server.log
      [ -f $f ] || continue
      cp $f $OUT/mlx_lm_server-${r%%:*}-${r##*:}.log
      grep -n -B2 -A30 "thread died\|Traceback\|rror" $f | head -60
    done ;;
esac
date -u +%H:%M:%S

# The 37th session's part for the next device session (it was lent none). Parts 1-13 are the
# 36th's: ../../2026-12-05-cpu-36th/scripts/next-session.sh, copied as
# devrun/next-session-36th.sh (it runs 1-7 through the 35th's, devrun/next-session-35th.sh).
# Setup: the 36th's header, then this file as devrun/next-session.sh and this folder's
# defer.patch as devrun/defer.patch (part 8's; the 35th's no longer applies: regenerated on
# this session's SSD tier, its test passing on CPU). Run 14 first (~200 s, mostly
# first-shape builds): this session changed what CUDA runs in three places.
case $1 in [1-9]|1[0-3]) exec bash devrun/next-session-36th.sh "$1" ;; esac
date -u +%H:%M:%S
case $1 in
14) # this session's engine fixes on CUDA: a verify pass over a rotated sliding-window ring
    # (its mask), a batched row that a prefill chunk carries past kv.start (CUDA's chunk,
    # 2048, is past the default kv.start, 1024), drafts that stop short of kv.start, the
    # grid trim beside encoded layers (on CUDA it is always on: short prompts beside
    # encoded layers failed every row of a pass, on CPU with CUDA's policy forced), an SSD
    # entry's first slots after a restart
    timeout 500 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_speculation.py \
      tests/test_kv_schemes.py tests/test_ssd_tier.py -k "short_rows_whole_window or \
      same_chunk or crossing_kv_start or headline_kv or re_sent or first_slots or \
      below_kv_start or trim_on_the_grid or one_token_prefill" 2>&1 | tail -15 ;;
esac
date -u +%H:%M:%S

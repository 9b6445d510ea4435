# For the next session (not run: this session's device budget was spent). Copy d2.sh,
# ../../2026-12-03-h200-26th/scripts/t4.sh (unchanged since),
# steptrace.py (it now also prints each run's steps to the first finish and its tail) and this
# file to devrun/. Four calls after install.sh, each under the 600 s limit:
#   bash devrun/next-session.sh 1 | 2 | 3 | 4
# The device's extra wheels must hold httptools and uvloop (pyproject.toml requires them;
# without them the server exits at start, which failed test_a_signal_stops_the_server_gracefully
# and the first agents attempts in the 27th session):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --platform manylinux2014_x86_64 -d .device/b/extra httptools uvloop pytest pluggy iniconfig pytest-xdist execnet packaging
# then, after install.sh:  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .device/b/extra/*.whl
# The machine goes back after 30 s idle: prepare every script before the first call, and
# chain the next call at once.
date -u +%H:%M:%S
case $1 in
1)  # The RAM tier's deltas (89dd697), the SSD chains and memory on CUDA (~4-5 min)
    timeout 500 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_prefix_cache.py tests/test_ssd_tier.py \
      tests/test_memory.py tests/test_speculation.py -k "not slow and (prefix or ssd or chains or memory or ram or cuda_shape_policy or token_exact_with_no_draft or rows_finished or live_row)" 2>&1 | grep -E "passed|failed|^FAILED|^E " | head -20 ;;
2)  # Issue 13 item 9 at the deltas: the 8B's RAM tier evicted 168-179 entries a run at
    # 6e8151e (1.44x, 1.75x); with deltas it should hold every turn (a few per cent more hits
    # at most: on CPU under a 400MB cap, 0.787-0.811 -> 0.811)
    RUNS="8b:1 8b:2" bash devrun/d2.sh ;;
3)  RUNS="8b:3 1b:1" bash devrun/d2.sh ;;
4)  # Issue 12 item 9: lookup at B=16 read paired 0.90-0.91 at 6e8151e while its all-rows
    # phase was ~1.2x draft=none's. At c0d2920 (yield per live row): the trace splits each
    # run at its first finish, then the bench itself
    timeout 250 python3 devrun/steptrace.py lookup 16 256 15 edit 2>&1 | grep -v Warning > $OUT/trace-lookup-edit.txt
    grep -E "^run|first finish|/ none" $OUT/trace-lookup-edit.txt | cut -c1-300
    bash devrun/t4.sh lookup ;;
esac
date -u +%H:%M:%S

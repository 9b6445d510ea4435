# For the next session (not run; this session's device budget was spent). Copy t4.sh beside
# this to devrun/, then one call each after install.sh (+ the pytest wheels in .device/b/extra):
# 1. The SSD tier's delta blobs (67665a3) and the control's changes on CUDA, exactness:
#    python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/b/extra/*.whl
#    python3 -m pytest -q -p no:cacheprovider -x tests/test_ssd_tier.py \
#      tests/test_speculation.py -k "ssd or chains or cuda_shape_policy or token_exact_with_no_draft or rows_finished"
# 2. Issue 12 item 9, B=16 at the session's code, lookup (not re-run at f4019cc):
#    bash devrun/t4.sh lookup
# 3. Issue 13 item 9 on the H200 at 67665a3 (agent-fleet's tiered cache now writes deltas):
#    the 23rd session's agents runs (docs/bench-results/2026-12-03-h200-23rd/scripts).

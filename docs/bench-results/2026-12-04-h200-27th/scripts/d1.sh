# Tests on CUDA at the session's code: SSD delta chains, the control, exactness; then lookup B=16.
# (devrun/t4.sh: docs/bench-results/2026-12-03-h200-26th/scripts/t4.sh)
date -u +%H:%M:%S; git log --oneline | head -1
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 0 -x tests/test_ssd_tier.py tests/test_speculation.py -k "ssd or chains or cuda_shape_policy or token_exact_with_no_draft or rows_finished" 2>&1 | grep -E "passed|failed|^FAILED|^E " | head -20
date -u +%H:%M:%S
bash devrun/t4.sh lookup

date -u +%H:%M:%S
timeout 520 python3 -m pytest -q -p no:cacheprovider -n 6 tests/test_prefix_cache.py tests/test_ssd_tier.py \
  tests/test_memory.py tests/test_speculation.py -k "not slow and (prefix or ssd or chains or memory or ram or cuda_shape_policy or token_exact_with_no_draft or rows_finished or live_row or waits_on or shadow)" 2>&1 | tee $OUT/pytest.txt | grep -E "passed|failed|^FAILED|^E " | head -20
date -u +%H:%M:%S

# 22nd session: which CUDA parity tests fail, with HOLD on (default) and off
K="held or admission_waits or test_rows_match_batch_generator"
timeout 45 python3 -m pytest -n 0 -q -p no:cacheprovider tests/test_batch_parity.py tests/test_batching.py -k "$K" -rf 2>&1 | grep -E "^FAILED|passed|failed|^E " | head -24
echo "== HOLD off"
PYTHONPATH=$PYTHONPATH:$PWD/devrun/nohold timeout 45 python3 -m pytest -n 0 -q -p no:cacheprovider -p noholdplug tests/test_batch_parity.py tests/test_batching.py -k "$K" -rf 2>&1 | grep -E "^FAILED|passed|failed" | head -16

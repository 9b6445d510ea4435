# The exactness tests on the H200 (ed38ec0's lookup check), after install.sh.
python3 -c "import pytest" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .device/b/extra/*.whl
date -u +%H:%M:%S
timeout 300 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_speculation.py -k "cuda_shape_policy or token_exact_with_no_draft" 2>&1 | tail -5
date -u +%H:%M:%S

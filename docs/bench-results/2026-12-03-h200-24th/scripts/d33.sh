T="tests/test_speculation.py::test_speculation_is_token_exact_with_no_draft_at_temperature_0"
timeout 120 python3 -m pytest -q -p no:cacheprovider -n 0 "$T[tiny-qwen3-next-b1-lookup]" "$T[tiny-qwen3-next-b1-scripted]" "$T[tiny-qwen3-next-static-2-lookup]" 2>&1 | grep -E "assert|Error|passed|failed" | head -20
echo ---- old
cd devrun/old && PYTHONPATH=$PWD:$PYTHONPATH timeout 120 python3 -m pytest -q -p no:cacheprovider -n 0 "$T[tiny-qwen3-next-b1-lookup]" 2>&1 | grep -E "assert|Error|passed|failed" | head -20

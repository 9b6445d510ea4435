date -u +%H:%M:%S
timeout 60 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_speculation.py -k "untapped or rests_where" 2>&1 | tail -2
bash devrun/t4.sh mtp

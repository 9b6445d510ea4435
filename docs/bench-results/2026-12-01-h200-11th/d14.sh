nvidia-smi --query-gpu=name,memory.used --format=csv
git log --oneline -1 2>/dev/null || true
date -u +%H:%M:%S
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_kv_cuda.py 2>&1 | tail -6
date -u +%H:%M:%S
timeout 280 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=spec draft=lookup hydra.run.dir=$OUT/spec 2>&1 | grep -v Warning | tail -14
date -u +%H:%M:%S

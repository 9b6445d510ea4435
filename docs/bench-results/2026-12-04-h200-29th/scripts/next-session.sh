# For the next session (30th). Set up .device with device-setup.sh (beside this file), copy
# this file, ../../2026-12-04-h200-28th/scripts/steptrace.py, ../../2026-12-04-h200-27th/
# scripts/d2.sh and ../../2026-12-03-h200-26th/scripts/t4.sh to devrun/ (what this session
# ran, unchanged), then four calls at once:
# stage.sh with .device/a, .device/c, .device/d; then, carrying .device/b and devrun:
#   bash .device/b/install.sh && . /tmp/mlx-env && python3 -m pip install -q --no-index \
#     --no-deps --upgrade --target /tmp/site .device/b/extra/*.whl; bash devrun/next-session.sh 1
# then `. /tmp/mlx-env && bash devrun/next-session.sh 2|3|4`, each call at once after the last
# (the machine goes back after 30 s idle: read the results after the last call).
date -u +%H:%M:%S
case $1 in
1)  # CUDA: the headline through the OpenAI client (its httpx2 was missing in the 29th), the
    # lone-row solo path and its seeded rows, the finished-row copy, the buffer-cache test
    timeout 400 python3 -m pytest -q -p no:cacheprovider -n 6 tests/test_speculation.py \
      tests/test_kv_schemes.py tests/test_memory.py \
      -k "headline or lone_row or next_probe or seeded or copied_out or buffer_cache or masked_rollbacks" 2>&1 \
      | tee $OUT/pytest.txt | grep -E "passed|failed|^FAILED" | head -20 ;;
2)  # Issue 12 item 9: free at B=1/4 for mtp and model (0.79-0.80x at B=1 in the 29th, before
    # lone rows ran solo), then lookup on both workloads
    A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
    for d in mtp model; do
      timeout 100 python3 -c "$A" mode=bench bench=spec draft=$d 'bench.spec_batches=[1,4]' \
        'bench.spec_workloads=[free]' bench.repeats=9 bench.decode_tokens=256 \
        bench.progress=false hydra.run.dir=/tmp/b14$d 2>&1 | grep -v Warning | tail -4 | head -2
      cp /tmp/b14$d/bench.json $OUT/spec-$d-b1-4-free.json
    done
    timeout 150 python3 -c "$A" mode=bench bench=spec draft=lookup 'bench.spec_batches=[1,4]' \
      bench.repeats=9 bench.decode_tokens=256 bench.progress=false hydra.run.dir=/tmp/b14l \
      2>&1 | grep -v Warning | tail -6 | head -4
    cp /tmp/b14l/bench.json $OUT/spec-lookup-b1-4.json ;;
3)  # B=16 again (lookup after 2bd7c51: one run so far; mtp)
    bash devrun/t4.sh "lookup mtp" ;;
4)  RUNS="8b:1 8b:2 1b:1" bash devrun/d2.sh ;;
esac
date -u +%H:%M:%S

# For the next session. Copy this file, steptrace.py (it takes the control's `left` now),
# ../../2026-12-04-h200-27th/scripts/d2.sh and ../../2026-12-03-h200-26th/scripts/t4.sh to
# devrun/. After stage.sh and stage2.sh, the third call installs and runs part 1:
#   bash .device/b/install.sh && . /tmp/mlx-env && python3 -m pip install -q --no-index \
#     --no-deps --upgrade --target /tmp/site .device/b/extra/*.whl; bash devrun/next-session.sh 1
# then `. /tmp/mlx-env && bash devrun/next-session.sh 2|5|3|4`, each call at once after the last
# (the machine goes back after 30 s idle: read the results after the last call).
date -u +%H:%M:%S
case $1 in
1)  # 77eef7a (GRID_TRIM beside encoded layers) on CUDA: the 4 tests that failed with a
    # broadcast error, the CUDA subset, and the headline's composition
    timeout 400 python3 -m pytest -q -p no:cacheprovider -n 6 tests/test_speculation.py \
      tests/test_kv_schemes.py tests/test_kv_cuda.py tests/test_batch_parity.py \
      -k "quantized or encoded or turboquant or k8v4 or cuda or grid or headline" 2>&1 \
      | tee $OUT/pytest-kv.txt | grep -E "passed|failed|^FAILED" | head -20 ;;
2)  # Issue 12 item 9: B=16 again (lookup, mtp, model; ~130 s each)
    bash devrun/t4.sh "lookup mtp model" ;;
5)  # free at B=1/4 for mtp and model (the best method's B=1 goal on free)
    A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
    for d in mtp model; do
      timeout 100 python3 -c "$A" mode=bench bench=spec draft=$d 'bench.spec_batches=[1,4]' \
        'bench.spec_workloads=[free]' bench.repeats=9 bench.decode_tokens=256 \
        bench.progress=false hydra.run.dir=/tmp/b14$d 2>&1 | grep -v Warning | tail -4 | head -2
      cp /tmp/b14$d/bench.json $OUT/spec-$d-b1-4-free.json
    done ;;
3)  RUNS="8b:3 1b:1" bash devrun/d2.sh ;;
4)  RUNS="8b:4 1b:2" bash devrun/d2.sh ;;
esac
date -u +%H:%M:%S

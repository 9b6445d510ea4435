# For the next session (32nd). Set up .device with device-setup.sh (beside this file: the
# extra wheels now go with c and d, so every call stays under 64 MiB), copy this folder's
# files (noclear/ too) and ../../2026-12-04-h200-27th/scripts/d2.sh and
# ../../2026-12-03-h200-26th/scripts/t4.sh to devrun/, then calls at once: stage.sh with
# .device/a, .device/c, .device/d; then, carrying .device/b and devrun:
#   bash .device/b/install.sh && . /tmp/mlx-env && bash devrun/next-session.sh 1
# then `. /tmp/mlx-env && bash devrun/next-session.sh 2|3`, each at once after the last.
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false"
case $1 in
1)  # Issue 13 item 9, Llama-3-8B: does the buffer-cache clear after each SSD write cost
    # more than it saves? The appliance alone, alternating the default (A) and no clear (B).
    for i in 1 2 3; do
      for v in A B; do
        E=""; [ $v = B ] && E="APPLIANCE_NO_SSD_CLEAR=1"
        env $E PYTHONPATH=$PWD/devrun/noclear:$PYTHONPATH timeout 150 python3 -c "$A" \
          mode=bench bench=agents +profile=agent-fleet $M8 bench.anchor=none \
          hydra.run.dir=/tmp/nc$v$i 2>&1 | grep -v Warning | tail -1 | cut -c1-230
        cp /tmp/nc$v$i/bench.json $OUT/agents-8b-alone-$v$i.json
      done
    done ;;
2)  RUNS="8b:1 8b:2 1b:1" timeout 590 bash devrun/d2.sh ;;
3)  # issue 12: the 31st session's two engine tests on CUDA (their first run there ran out
    # of lease), then B=16 after f7b8892 (mtp's plain steps untapped while its control rests)
    # and a drafter's lone prefilling row past its checkpoints (af4f00d)
    timeout 180 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_speculation.py \
      tests/test_prefix_cache.py -k "untapped or rests_where or logged_and_applied or \
      lone_rows_pass_runs" 2>&1 | tail -3
    timeout 400 bash devrun/t4.sh "mtp model" ;;
esac
date -u +%H:%M:%S

# For the next session (31st). Set up .device with device-setup.sh (beside this file), copy
# this file and ../../2026-12-04-h200-27th/scripts/d2.sh to devrun/, then calls at once:
# stage.sh with .device/a, .device/c, .device/d; then, carrying .device/b and devrun:
#   bash .device/b/install.sh && . /tmp/mlx-env && python3 -m pip install -q --no-index \
#     --no-deps --upgrade --target /tmp/site .device/b/extra/*.whl; bash devrun/next-session.sh 1
# then `. /tmp/mlx-env && bash devrun/next-session.sh 2|3`, each at once after the last (the machine
# goes back after 30 s idle: read the results after the last call).
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false"
case $1 in
1)  # Issue 13 item 9, Llama-3-8B: the appliance's rate followed its prefill time (8.0-11.4 s
    # a run, same work) in the 30th. Where does its engine thread spend a run? (The appliance
    # alone, sampled by py-spy; its raw stacks come back.)
    PY=$(ls /tmp/site/bin/py-spy 2>/dev/null || command -v py-spy)
    timeout 280 $PY record --subprocesses --idle -r 200 --format raw -o $OUT/prof-8b.txt -- \
      python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 bench.anchor=none \
      hydra.run.dir=/tmp/prof8 2>&1 | grep -v Warning | tail -3
    cp /tmp/prof8/bench.json $OUT/agents-8b-alone-prof.json ;;
2)  RUNS="8b:1 8b:2 1b:1" bash devrun/d2.sh ;;
3)  # Issue 12 item 9: lookup free at B=1 stood at 1.50x paired (1.45x best-run) in the 30th
    timeout 200 python3 -c "$A" mode=bench bench=spec draft=lookup 'bench.spec_batches=[1]' \
      'bench.spec_workloads=[free]' bench.repeats=15 bench.decode_tokens=256 \
      bench.progress=false hydra.run.dir=/tmp/b1l 2>&1 | grep -v Warning | tail -4 | head -2
    cp /tmp/b1l/bench.json $OUT/spec-lookup-b1-free-x15.json ;;
esac
date -u +%H:%M:%S

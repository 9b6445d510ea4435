# Its successor: ../../2026-12-05-cpu-36th/scripts/next-session.sh (parts 8-13; it runs 1-7
# through this file, copied as devrun/next-session-35th.sh).
# The 35th session's copy of ../../2026-12-04-cpu-34th/scripts/next-session.sh (the same setup
# and copies into devrun/). Fixed here: parts 1 and 5 set PYTHONPATH without /tmp/site (where
# install.sh put MLX), so on the device every run failed at once (part 1 ran after the fix);
# TRACES picks part 1's runs; part 7 (new) runs the 8B tiered against cache=ram.
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false"
case $1 in
1)  # issue 13 item 9: where the 8B agents run's prefill-carrying time goes (8-16 s a run for
    # the same work, 30th-33rd sessions): every decode step, join and prefill pass timed
    for i in ${TRACES:-1 2}; do
      TRACE_OUT=/tmp/tt8b$i PYTHONPATH=$PWD/devrun/ticktrace:$PYTHONPATH timeout 250 python3 -c "$A" \
        mode=bench bench=agents +profile=agent-fleet $M8 bench.anchor=none \
        hydra.run.dir=/tmp/tt8b$i 2>&1 | grep BENCH | cut -c1-230
      cp /tmp/tt8b$i/bench.json $OUT/agents-8b-trace$i.json
      for f in /tmp/tt8b$i.*; do
        [ -s "$f" ] && gzip -c "$f" > $OUT/ticktrace-8b$i.jsonl.gz && python3 devrun/ticksummary.py "$f"
      done
    done ;;
2)  # issue 13 item 9 at the session's last code
    RUNS="8b:1 8b:2 1b:1" timeout 590 bash devrun/d2.sh ;;
3)  # issue 12 item 9: B=16 again, mtp and model (the 33rd: model edit 0.93 paired, A/A 0.92)
    timeout 560 bash devrun/t4.sh "model mtp" ;;
4)  # issue 12 item 9: what a probe mid-run costs on CUDA (the 33rd's mtp free run with a
    # later probe read 0.39x paired; its steptrace probed only in run 0, where the probe
    # cost ~50 ms): probes forced into runs 4, 7, 10 and 13, every step's time printed
    FORCE=3:60,6:120,9:180,12:220 timeout 560 python3 devrun/probetrace.py mtp 16 256 15 free \
      > $OUT/probetrace-mtp-b16-free.txt 2>&1
    grep -E "^run|forced|paired" $OUT/probetrace-mtp-b16-free.txt | cut -c1-220 ;;
5)  # 8ff5de0 and b7a3524 (a joining row takes a held row's slot in place, and the warm-up builds
    # both joins; CPU 1.00x paired) on the
    # H200 8B, where finished rows are always held: the appliance alone, the code before it
    # (reuse.patch reversed in a copy) and after, alternating; joins placed in held slots
    rm -rf /tmp/old && mkdir -p /tmp/old && cp -r appliance conf profiles pyproject.toml /tmp/old/
    (cd /tmp/old && (git apply -R "$OLDPWD/devrun/reuse.patch" || patch -R -p1 < "$OLDPWD/devrun/reuse.patch")) \
      && ! grep -q "def reuse" /tmp/old/appliance/engine/rows.py || { echo "no old copy"; exit 1; }
    for i in ${PAIRS:-1 2 3}; do
      for v in old new; do
        if [ $v = old ]; then P=/tmp/old; X=; else P=$PWD; X=$PWD/devrun/reuse; fi
        (cd $P && REUSE_OUT=/tmp/reuse-$v$i PYTHONPATH=$P:$X:/tmp/site timeout 95 python3 -c "$A" mode=bench \
          bench=agents +profile=agent-fleet $M8 bench.anchor=none hydra.run.dir=/tmp/re$v$i 2>&1 \
          | grep BENCH | sed "s/^/$v$i /" | cut -c1-200)
        cp /tmp/re$v$i/bench.json $OUT/agents-8b-reuse-$v$i.json 2>/dev/null
        cat /tmp/reuse-$v$i.* 2>/dev/null; echo
      done
    done ;;
7)  # 35th: the SSD tier's cost on the 8B (agent-fleet selects cache=tiered; 59 blobs, ~7 GB a
    # run, each read on the host): the appliance alone, tiered against cache=ram, alternating
    for i in ${PAIRS:-1 2}; do
      for c in tiered ram; do
        timeout 120 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 \
          bench.anchor=none cache=$c hydra.run.dir=/tmp/c$c$i 2>&1 | grep BENCH | sed "s/^/$c$i /" | cut -c1-200
        cp /tmp/c$c$i/bench.json $OUT/agents-8b-cache-$c$i.json 2>/dev/null
      done
    done ;;
6)  # this session's engine tests on CUDA (slot reuse under CUDA's own HOLD and shapes, the
    # warm-up's two joins), before or beside 5
    timeout 300 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_batch_parity.py \
      tests/test_warmup.py -k "slot_in_place or held or warm_up or burst" 2>&1 | tail -15 ;;
esac
date -u +%H:%M:%S

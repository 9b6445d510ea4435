# Setup as the 35th's notes say (device-setup.sh, then copies into devrun/: this file,
# reform.py, readsync.py, width.patch and reads.patch from here; the rest from the 35th's
# list: its ticktrace/ syncs after a prefill pass since the 36th). Order for a ~1,700 s budget, each call at once after the last: install +
# `RUNS="8b:1 8b:2" bash devrun/d2.sh` (~420 s); `bash devrun/next-session.sh 12; bash
# devrun/next-session.sh 10` (~100 s); 13 (~200 s; its reads matter only if 12 shows a read
# waiting: the 27th-28th sessions saw plain steps pipelined on CUDA, a synchronous step
# costing about two); `RUNS="8b:3 1b:1" bash devrun/d2.sh` (~350 s); then 11 if 10 shows a
# new size costs more than new buffers; 7, 9, 3, 4.
# The 36th session's copy of the 35th's (new: part 8, defer.patch A/B on the 8B; part 9,
# batch.prefill_rows=2 against the plan's 1 on the 8B; part 10, reform.py: the decode steps
# after a join by kind: in place / same size re-formed / grown; part 11, width.patch A/B: a
# re-forming join drops only as many held rows as join, so the batch keeps its size). The
# 36th was lent no device. Parts 12-13: does a host read of a small device array wait for
# the work queued after it (readsync.py), and reads.patch A/B (the decode step reads its
# tokens through <= 8-byte copies).
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
8)  # 35th's defer.patch (an SSD copy's hand-over to the writer deferred to the next step; CPU
    # 0.99-1.00x) on the 8B, where the tier's copies are device-to-host: the appliance alone,
    # current code against the patched copy, alternating
    rm -rf /tmp/dfr && mkdir -p /tmp/dfr && cp -r appliance conf profiles pyproject.toml tests /tmp/dfr/
    (cd /tmp/dfr && patch -p1 -s < "$OLDPWD/devrun/defer.patch") || { echo "no patched copy"; exit 1; }
    for i in ${PAIRS:-1 2}; do
      for v in cur dfr; do
        if [ $v = cur ]; then P=$PWD; else P=/tmp/dfr; fi
        (cd $P && PYTHONPATH=$P:/tmp/site timeout 110 python3 -c "$A" mode=bench bench=agents \
          +profile=agent-fleet $M8 bench.anchor=none hydra.run.dir=/tmp/df$v$i 2>&1 \
          | grep BENCH | sed "s/^/$v$i /" | cut -c1-200)
        cp /tmp/df$v$i/bench.json $OUT/agents-8b-defer-$v$i.json 2>/dev/null
      done
    done ;;
9)  # issue 13 item 9: waiting tails prefilled together (batch.prefill_rows=2) on the 8B, where
    # a one-row prefill pass has a ~20 ms fixed cost (35th trace) that a second row may share;
    # on CPU 4 rows read 0.78-0.81x (7th session). The appliance alone, alternating
    for i in ${PAIRS:-1 2}; do
      for r in 1 2; do
        timeout 110 python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $M8 \
          bench.anchor=none batch.prefill_rows=$r hydra.run.dir=/tmp/pr$r$i 2>&1 | grep BENCH \
          | sed "s/^/rows$r-$i /" | cut -c1-200
        cp /tmp/pr$r$i/bench.json $OUT/agents-8b-prefill-rows$r-$i.json 2>/dev/null
      done
    done ;;
10) # issue 13 item 9: is the excess after a join (35th trace: 0.9 s a run) the new batch size
    # or the new buffers? (if the size: keep the batch at its width when it re-forms)
    REPS=${REPS:-4} timeout 400 python3 devrun/reform.py model=synthetic model.shape=llama-3-8b \
      model.bits=4 +profile=agent-fleet 2>&1 | grep -v Warn | tee $OUT/reform-8b.txt | tail -20 ;;
11) # width.patch (36th, not committed: tests pass on CPU, where it changes nothing): on CUDA a
    # row too long for a held slot re-forms the batch dropping only as many held rows as
    # join, so the size stays (35th trace: 34 growing joins, ~0.9 s over the steady steps).
    # Worth it if part 10 says a new size, not new buffers, costs the excess; the held rows
    # kept decode over their KV meanwhile. The appliance alone, alternating
    rm -rf /tmp/wid && mkdir -p /tmp/wid && cp -r appliance conf profiles pyproject.toml tests /tmp/wid/
    (cd /tmp/wid && patch -p1 -s < "$OLDPWD/devrun/width.patch") || { echo "no patched copy"; exit 1; }
    for i in ${PAIRS:-1 2 3}; do
      for v in cur wid; do
        if [ $v = cur ]; then P=$PWD; else P=/tmp/wid; fi
        (cd $P && PYTHONPATH=$P:/tmp/site timeout 110 python3 -c "$A" mode=bench bench=agents \
          +profile=agent-fleet $M8 bench.anchor=none hydra.run.dir=/tmp/wd$v$i 2>&1 \
          | grep BENCH | sed "s/^/$v$i /" | cut -c1-200)
        cp /tmp/wd$v$i/bench.json $OUT/agents-8b-width-$v$i.json 2>/dev/null
      done
    done ;;
12) # does reading a small device array on the host wait for the work queued behind it? (MLX
    # CUDA moves a device buffer to managed memory on its first host read: a cudaFree, which
    # synchronizes the device). If so, every decode step's `inputs.tolist()` waits for the
    # step queued after it, and decode is not pipelined (mlx_lm's BatchGenerator reads alike)
    timeout 200 python3 devrun/readsync.py 2>&1 | tee $OUT/readsync.txt ;;
13) # reads.patch (36th, not committed; every engine test passes with it forced on CPU): on
    # CUDA the decode step reads its sampled tokens through copies of two tokens (8 bytes,
    # MLX's managed small pool), as do the verify paths' pending reads. The appliance alone,
    # 8B agents, alternating. (The 36th's other half of this, a prefill pass queued rather
    # than waited for, was committed after a CPU A/B: the d2 runs measure it on CUDA.)
    rm -rf /tmp/rds && mkdir -p /tmp/rds && cp -r appliance conf profiles pyproject.toml tests /tmp/rds/
    (cd /tmp/rds && patch -p1 -s < "$OLDPWD/devrun/reads.patch") || { echo "no patched copy"; exit 1; }
    for i in ${PAIRS:-1 2 3}; do
      for v in cur rds; do
        if [ $v = cur ]; then P=$PWD; else P=/tmp/rds; fi
        (cd $P && PYTHONPATH=$P:/tmp/site timeout 110 python3 -c "$A" mode=bench bench=agents \
          +profile=agent-fleet $M8 bench.anchor=none hydra.run.dir=/tmp/rd$v$i 2>&1 \
          | grep BENCH | sed "s/^/$v$i /" | cut -c1-200)
        cp /tmp/rd$v$i/bench.json $OUT/agents-8b-reads-$v$i.json 2>/dev/null
      done
    done ;;
esac
date -u +%H:%M:%S

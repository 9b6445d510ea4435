# (Since the 37th: copied as devrun/next-session-36th.sh; ../../2026-12-05-cpu-37th/scripts/
# next-session.sh is devrun/next-session.sh, adds part 14 and runs 1-13 through this file.)
# The 36th session's parts for the next device session (it was lent none); parts 1-7 are the
# 35th's, run through ../../2026-12-05-h200-35th/scripts/next-session.sh (copied as
# devrun/next-session-35th.sh). Setup as the 35th's notes say (device-setup.sh, then copies
# into devrun/: this file, reform.py, readsync.py, width.patch and reads.patch from here; the
# rest from the 35th's list: its ticktrace/ syncs after a prefill pass since the 36th).
# Order for a ~1,700 s budget, each call at once after the last: install + `RUNS="8b:1 8b:2"
# bash devrun/d2.sh` (~420 s); `bash devrun/next-session.sh 12; bash devrun/next-session.sh
# 10` (~100 s); 13 (~200 s; its reads matter only if 12 shows a read waiting: the 27th-28th
# sessions saw plain steps pipelined on CUDA, a synchronous step costing about two);
# `RUNS="8b:3 1b:1" bash devrun/d2.sh` (~350 s); then 11 if 10 shows a new size costs more
# than new buffers; 7, 9, 3, 4.
case $1 in [1-7]) exec bash devrun/next-session-35th.sh "$1" ;; esac
date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
M8="model=synthetic model.shape=llama-3-8b model.bits=4 bench.agents=16 bench.turns=4 bench.progress=false"

ab() {  # ab NAME PATCH [PAIRS]: the 8B agents run, the appliance alone, this code against a
  # copy with devrun/PATCH applied, alternating; bench.json of each to $OUT
  local name=$1 new=/tmp/ab-$1
  rm -rf $new && mkdir -p $new && cp -r appliance conf profiles pyproject.toml tests $new/
  (cd $new && patch -p1 -s < "$OLDPWD/devrun/$2") || { echo "no patched copy"; exit 1; }
  for i in ${3:-1 2 3}; do
    for v in cur $name; do
      if [ $v = cur ]; then P=$PWD; else P=$new; fi
      (cd $P && PYTHONPATH=$P:/tmp/site timeout 110 python3 -c "$A" mode=bench bench=agents \
        +profile=agent-fleet $M8 bench.anchor=none hydra.run.dir=/tmp/ab$name-$v$i 2>&1 \
        | grep BENCH | sed "s/^/$v$i /" | cut -c1-200)
      cp /tmp/ab$name-$v$i/bench.json $OUT/agents-8b-$name-$v$i.json 2>/dev/null
    done
  done
}

case $1 in
8)  # 35th's defer.patch (an SSD copy's hand-over to the writer deferred to the next step; CPU
    # 0.99-1.00x) on the 8B, where the tier's copies are device-to-host
    ab defer defer.patch "${PAIRS:-1 2}" ;;
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
11) # width.patch (not committed: tests pass on CPU, where it changes nothing): on CUDA a row
    # too long for a held slot re-forms the batch dropping only as many held rows as join, so
    # the size stays (35th trace: 34 growing joins, ~0.9 s over the steady steps). Worth it if
    # part 10 says a new size, not new buffers, costs the excess; the held rows kept decode
    # over their KV meanwhile
    ab width width.patch "${PAIRS:-1 2 3}" ;;
12) # does reading a small device array on the host wait for the work queued behind it? (MLX
    # CUDA moves a device buffer to managed memory on its first host read: a cudaFree, which
    # synchronizes the device). If so, every decode step's `inputs.tolist()` waits for the
    # step queued after it, and decode is not pipelined (mlx_lm's BatchGenerator reads alike)
    timeout 200 python3 devrun/readsync.py 2>&1 | tee $OUT/readsync.txt ;;
13) # reads.patch (not committed; every engine test passes with it forced on CPU): on CUDA the
    # decode step reads its sampled tokens through copies of two tokens (8 bytes, MLX's
    # managed small pool), as do the verify paths' pending reads. (The 36th's other half of
    # this, a prefill pass queued rather than waited for, was committed after a CPU A/B: the
    # d2 runs measure it on CUDA.)
    ab reads reads.patch "${PAIRS:-1 2 3}" ;;
esac
date -u +%H:%M:%S

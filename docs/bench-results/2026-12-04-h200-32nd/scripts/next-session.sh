# For the next session (33rd). Set up .device with
# ../../2026-12-04-h200-31st/scripts/device-setup.sh, copy this file,
# ../../2026-12-04-h200-28th/scripts/steptrace.py, ../../2026-12-04-h200-27th/scripts/d2.sh
# and ../../2026-12-03-h200-26th/scripts/t4.sh to devrun/, then calls at once: stage.sh with
# .device/a, .device/c, .device/d; then, carrying .device/b and devrun:
#   bash .device/b/install.sh && . /tmp/mlx-env && bash devrun/next-session.sh 1
# then `. /tmp/mlx-env && bash devrun/next-session.sh 2|3`, each at once after the last.
date -u +%H:%M:%S
case $1 in
1)  # issue 12 item 9: B=16 with model beside mtp (model free read 0.95 paired, 0.80 best,
    # on the 32nd's noisy host), at the code since 49a73c7 (carried decisions back off)
    timeout 560 bash devrun/t4.sh "model mtp" ;;
2)  # why a probe's run costs ~0.9 s on CUDA (32nd: mtp free runs at 2,830-2,929 tok/s
    # against ~7,500 when they probed): every step's time, the probe's steps among them
    timeout 560 python3 devrun/steptrace.py mtp 16 256 15 free > $OUT/steptrace-mtp-b16-free.txt 2>&1
    grep -E "^run|paired" $OUT/steptrace-mtp-b16-free.txt | cut -c1-220 ;;
3)  # issue 13 item 9 at the session's last code (partial-entry hits since c74acbf)
    RUNS="8b:1 8b:2 1b:1" timeout 590 bash devrun/d2.sh ;;
4)  # issue 12 item 9: lookup with draft.ngram_min=1 (the CPU read free B=1 1.53-1.65x paired
    # against 1.44-1.48x with the default 2), B=1/4 then B=16, against the default's figures
    A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
    timeout 280 python3 -c "$A" mode=bench bench=spec draft=lookup draft.ngram_min=1 \
      'bench.spec_batches=[1,4]' bench.repeats=9 bench.decode_tokens=256 bench.progress=false \
      hydra.run.dir=/tmp/ng1 2>&1 | grep -E "^edit|^free"
    cp /tmp/ng1/bench.json $OUT/spec-lookup-ng1-b1-b4.json
    timeout 280 python3 -c "$A" mode=bench bench=spec draft=lookup draft.ngram_min=1 \
      'bench.spec_batches=[16]' bench.repeats=15 bench.decode_tokens=256 bench.progress=false \
      hydra.run.dir=/tmp/ng16 2>&1 | grep -E "^edit|^free"
    cp /tmp/ng16/bench.json $OUT/spec-lookup-ng1-b16.json ;;
esac
date -u +%H:%M:%S

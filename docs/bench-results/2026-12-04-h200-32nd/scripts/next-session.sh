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
esac
date -u +%H:%M:%S

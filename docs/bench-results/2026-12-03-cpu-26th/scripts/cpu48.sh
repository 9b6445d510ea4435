# Issue 12 item 9, CPU: mtp at B=16 at the session's code (the control's and step's changes).
cd /work/main && . .venv/bin/activate
date -u +%H:%M:%S
appliance mode=bench bench=spec draft=mtp 'bench.spec_batches=[16]' bench.repeats=15 bench.decode_tokens=256 bench.progress=false hydra.run.dir=/tmp/cpu48 2>&1 | grep -v Warning | tail -4 | head -3
date -u +%H:%M:%S

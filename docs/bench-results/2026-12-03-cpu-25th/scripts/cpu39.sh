# Issue 13 item 9, CPU: does the SSD tier's work (agent-fleet's cache=tiered) take the engine's
# cores in an agents run? Alternating runs, the appliance alone (no anchor).
cd /work/main && . .venv/bin/activate
mkdir -p /tmp/cpu39
for i in 1 2 3; do
for c in tiered ram; do
date -u +%H:%M:%S
appliance mode=bench bench=agents +profile=agent-fleet cache=$c bench.anchor=none bench.progress=false hydra.run.dir=/tmp/cpu39/$c-$i 2>&1 | grep -E "^BENCH|tok/s" | tail -2
done
done
date -u +%H:%M:%S

# the "idle" variant runs with PYTHONPATH=/tmp/sc, holding idle_only_sitecustomize.py as sitecustomize.py
cd /work/main && . .venv/bin/activate
mkdir -p /tmp/cpu40
for i in 1 2; do
for c in tiered idle ram; do
date -u +%H:%M:%S
if [ $c = idle ]; then pp=/tmp/sc; cc=tiered; else pp=; cc=$c; fi
PYTHONPATH=$pp appliance mode=bench bench=agents +profile=agent-fleet cache=$cc bench.anchor=none bench.progress=false hydra.run.dir=/tmp/cpu40/$c-$i 2>&1 | grep -E "^BENCH" | tail -1 | cut -c1-220
done
done

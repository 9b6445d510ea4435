# the "copyonly" variant runs with PYTHONPATH=/tmp/sc2, holding copy_only_sitecustomize.py as sitecustomize.py
cd /work/main && . .venv/bin/activate
mkdir -p /tmp/cpu41
for i in 1 2; do
for c in tiered copyonly ram; do
date -u +%H:%M:%S
if [ $c = copyonly ]; then pp=/tmp/sc2; cc=tiered; else pp=; cc=$c; fi
PYTHONPATH=$pp appliance mode=bench bench=agents +profile=agent-fleet cache=$cc bench.anchor=none bench.progress=false hydra.run.dir=/tmp/cpu41/$c-$i 2>&1 | grep -E "^BENCH" | tail -1 | cut -c1-160
done
done

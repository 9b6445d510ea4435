# Issue 12 item 1 under the agents' load: draft=none, lookup (ngram_min 2, the old default)
# and lookup with ngram_min=1, the appliance alone, alternating (33rd session, CPU).
. /work/main/.venv/bin/activate
export OPENBLAS_NUM_THREADS=2
cd /work/main
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for i in ${ROUNDS:-1 2}; do
  for v in none ng2 ng1; do
    case $v in none) o="draft=none";; ng2) o="draft=lookup draft.ngram_min=2";; ng1) o="draft=lookup draft.ngram_min=1";; esac
    python3 -c "$A" mode=bench bench=agents +profile=agent-fleet $o bench.progress=false bench.anchor=none hydra.run.dir=/tmp/cpu33/la-$v$i 2>&1 | grep BENCH | sed "s/^/$v$i /" | cut -c1-220
    cp /tmp/cpu33/la-$v$i/bench.json docs/bench-results/2026-12-04-cpu-33rd/agents-lookup-$v$i.json
  done
done

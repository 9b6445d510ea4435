cd /work/main && . .venv/bin/activate
for i in 1 2; do for v in new old; do
  cp /tmp/control_$v.py appliance/engine/speculate/control.py
  echo "== $v $i $(date +%T)"
  appliance mode=bench bench=spec draft=lookup 'bench.spec_batches=[16]' hydra.run.dir=/tmp/ab16/$v-$i 2>&1 | grep -E "^(edit|free) "
done; done
cp /tmp/control_new.py appliance/engine/speculate/control.py
echo done

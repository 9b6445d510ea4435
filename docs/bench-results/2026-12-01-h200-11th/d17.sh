A='python3 -c "import sys; from appliance.cli import main; sys.argv[0]=\"appliance\"; main()"'
run() { eval timeout 120 $A mode=bench bench=fleet model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 "$@" 2>&1 | grep -v Warning | grep "^BENCH\|^self\|^mlx"; }
for i in 1 2 3; do
  run bench.target=self hydra.run.dir=$OUT/fleet-self-$i
  run bench.target=mlx_lm hydra.run.dir=$OUT/fleet-mlx-$i
done
date -u +%H:%M:%S
eval timeout 200 $A mode=bench bench=fleet model=synthetic model.shape=llama-3-8b model.bits=4 model.dtype=bfloat16 hydra.run.dir=$OUT/fleet8b 2>&1 | grep "^BENCH"
grep -h "warm-up" $OUT/fleet8b/appliance.log
date -u +%H:%M:%S

# Issue 13 item 10 on the device: plain appliance vs mlx_lm.server, bench=fleet, 1B bf16, alternating pairs.
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for i in ${RUNS:-1 2 3}; do
  for t in self mlx_lm; do
    date -u +%H:%M:%S
    timeout 200 python3 -c "$A" mode=bench bench=fleet bench.target=$t model=synthetic model.shape=llama-3.2-1b model.dtype=bfloat16 bench.progress=false hydra.run.dir=/tmp/fl$t$i 2>&1 | grep -v Warning | tail -1
    cp /tmp/fl$t$i/bench.json $OUT/fleet-1b-$t-$i.json
  done
done
date -u +%H:%M:%S

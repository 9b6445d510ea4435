# 14th session: issue 12 item 9 on the H200 (embedded model), with the MLX settings of _mlx_env.
date -u +%H:%M:%S
timeout 560 python3 -c "import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()" mode=bench bench=spec draft=lookup hydra.run.dir=/tmp/spec 2>&1 | grep -v Warning | tail -16
cp /tmp/spec/bench.json $OUT/spec-lookup.json
date -u +%H:%M:%S

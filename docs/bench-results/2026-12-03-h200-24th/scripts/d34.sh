date -u +%H:%M:%S
A="import sys; from appliance.cli import main; sys.argv[0]='appliance'; main()"
for dr in mtp:7 model:5; do d=${dr%:*}; r=${dr#*:}
S="mode=bench bench=spec draft=$d bench.spec_batches=[16] bench.repeats=$r bench.progress=false"
timeout 150 python3 -c "$A" $S hydra.run.dir=/tmp/sp_$d 2>&1 | grep -v Warning | tail -4 | head -3
cp /tmp/sp_$d/bench.json $OUT/spec-$d-b16-aa.json; date -u +%H:%M:%S
done

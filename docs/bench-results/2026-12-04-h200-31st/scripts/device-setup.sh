#!/usr/bin/env bash
# Prepares .device/{a,c,d,b} for the H200 from a fresh checkout: the 30th session's
# device-setup.sh, then the extra wheels (server, tests, py-spy) moved from b/extra into c
# and d, alternately: stage.sh copies them to /tmp/mlx-stage with the CUDA parts, and
# install.sh installs every staged wheel. The working tree is ~29 MB; with b/extra the b call
# carried ~66 MB of the 64 MiB a run may (a 0.75 MB file more refused it, 31st session).
# Calls, each at once after the last: `bash .device/a/stage.sh` (carry .device/a), the same
# for c and d, then `bash .device/b/install.sh && . /tmp/mlx-env && <command>` (carry
# .device/b and devrun).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bash docs/bench-results/2026-12-04-h200-30th/scripts/device-setup.sh
i=0
for w in .device/b/extra/*.whl; do
  if [ $((i % 2)) = 0 ]; then mv "$w" .device/c/; else mv "$w" .device/d/; fi
  i=$((i + 1))
done
rmdir .device/b/extra
du -sh .device/*

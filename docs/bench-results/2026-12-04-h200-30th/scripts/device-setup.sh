#!/usr/bin/env bash
# Prepares .device/{a,c,d,b} for the H200 from a fresh checkout: the 29th session's
# device-setup.sh (its comment says how the four parts go over), then py-spy among the
# extra wheels (next-session.sh 1 profiles with it).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bash docs/bench-results/2026-12-04-h200-29th/scripts/device-setup.sh
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_5_x86_64 -d .device/b/extra py-spy
du -sh .device/b

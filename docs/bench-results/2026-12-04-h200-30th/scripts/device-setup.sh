#!/usr/bin/env bash
# Prepares .device/{a,c,d,b} for the H200 from a fresh checkout (.device is git-ignored and not
# kept between sessions). The working tree alone is ~29 MiB of the 64 MiB a run may carry, so
# the CUDA wheel goes over in four parts: calls `bash .device/a/stage.sh` (carry .device/a),
# the same for c and d, then `bash .device/b/install.sh && . /tmp/mlx-env && python3 -m pip
# install -q --no-index --no-deps --upgrade --target /tmp/site .device/b/extra/*.whl; ...`
# (carry .device/b and devrun), each at once after the last (the machine goes back after 30 s).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bash ../shared/device/prepare.sh
cd .device
cat a/cuda.part.aa b/cuda.part.ab > /tmp/cuda.whl && rm a/cuda.part.aa b/cuda.part.ab
mkdir -p c d b/extra && split -n 4 /tmp/cuda.whl /tmp/cudapart. && rm /tmp/cuda.whl
mv /tmp/cudapart.aa a/cuda.part.aa && mv /tmp/cudapart.ab c/cuda.part.ab
mv /tmp/cudapart.ac d/cuda.part.ac && mv /tmp/cudapart.ad b/cuda.part.ad
cp a/stage.sh c/ && cp a/stage.sh d/ && chmod u+w b/install.sh
sed -i 's|cuda.part.ab \$s/|cuda.part.ad $s/|; s|\$s/cuda.part.aa \$s/cuda.part.ab >|$s/cuda.part.aa $s/cuda.part.ab $s/cuda.part.ac $s/cuda.part.ad >|' b/install.sh
# The server needs httptools and uvloop; the tests pytest, xdist and the openai client; a
# profile py-spy.
pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 -d b/extra \
  httptools uvloop pytest pytest-xdist execnet iniconfig pluggy openai httpx2 httpcore2 \
  truststore h11 pydantic pydantic-core jiter distro annotated-types typing-inspection \
  typing-extensions tqdm py-spy
du -sh a b c d

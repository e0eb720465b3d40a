#!/usr/bin/env bash
# The wheels the GPU machine lacks, into .whl/ (carried by the device call): ../shared/gpu/fetch_wheels.sh's set,
# plus what `pytest tests/gpu` needs there (pytest, pluggy, iniconfig, pytest-timeout, pygments: pure Python),
# at the versions constraints.txt pins. From the repo root:  bash bench/gpu/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
bash ../shared/gpu/fetch_wheels.sh
for n in pytest pluggy iniconfig pytest-timeout pygments; do
  spec=$(grep -iE "^${n//-/[-_]}==" constraints.txt | head -1)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl "$spec"
done
du -sh .whl

#!/usr/bin/env bash
# One prepared GPU call (issue 38): hydratune beside TRL on one GPU, the memory estimate against the measured
# peaks, and the GPU test tier; everything into $OUT (default ./gpu-out). From the repo root:
#
#   COMMIT=<sha> bash bench/gpu/run.sh              # on the GPU machine, .whl/ carried (fetch_wheels.sh)
#   bash bench/gpu/run.sh --dry-run                 # on CPU: the same code path, tiny shape, 2 steps a row
#
# The GPU machine lacks trl, datasets, deepspeed, hydra, ...: the wheels in .whl/ (../shared/gpu/fetch_wheels.sh)
# are installed with --target into a scratch dir put first on PYTHONPATH (its torch stays the machine's own).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  site="${TMPDIR:-/tmp}/hydratune-site"
  if [ ! -f "$site/.installed" ]; then
    "${PYTHON:-python3}" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl 2>&1 | tail -3 || true
    touch "$site/.installed"
  fi
  export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  # a carried wheel whose own dependencies the machine has too old (tokenizers, huggingface-hub) gives way to
  # the machine's copy, saying so
  for mod in transformers peft; do
    if ! err=$("${PYTHON:-python3}" -c "import $mod" 2>&1 >/dev/null); then
      echo "run.sh: the carried $mod does not import here (${err##*$'\n'}); the machine's own is used" >&2
      rm -rf "$site/$mod" "$site/$mod"-*.dist-info
    fi
  done
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export COMMIT="${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
exec "${PYTHON:-python3}" bench/gpu/run.py "$@"

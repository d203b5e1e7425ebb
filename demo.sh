#!/usr/bin/env bash
# The main job: train the default model (appliance/examples/train.py) data-parallel on two
# ranks of this machine. Creates .venv and installs the project on first use.
#
#   bash demo.sh                 # 2 ranks
#   bash demo.sh -np 3 -H localhost:3
set -euo pipefail
cd "$(dirname "$0")"
say() { printf '\033[1m[demo]\033[0m %s\n' "$*"; }

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/appliance ] || ! .venv/bin/python -c "import appliance.runtime._core, torch, sklearn" 2>/dev/null; then
  say "installing the project into .venv (first run only; compiles the C++ core)"
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[train]'
fi
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(-np 2 -H localhost:2)
say "appliance launch ${args[*]} -- python -m appliance.examples.train"
exec .venv/bin/appliance launch "${args[@]}" -- .venv/bin/python -m appliance.examples.train

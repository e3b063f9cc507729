#!/usr/bin/env bash
# Create (or reuse) a virtualenv and install lightning-ext (editable) with its test and plot extras, against one
# Lightning release. Usage: scripts/bootstrap.sh [VENV [LIGHTNING_VERSION]]   (default: .venv 2.6.6)
# torch is pinned first, from constraints.txt, so no resolver ever pulls a CUDA build. Lightning and its twin
# package pytorch-lightning are pinned to the same release, so each venv holds exactly one verified Lightning.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
LIGHTNING=${2:-2.6.6}
PYTHON=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.lightning-ext-installed
want=$({ cat pyproject.toml constraints.txt; echo "lightning==$LIGHTNING"; } | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -c constraints.txt "torch==2.13.0"
"$VENV/bin/python" -m pip install --quiet -c constraints.txt -e ".[test,plot]" \
  "lightning==$LIGHTNING" "pytorch-lightning==$LIGHTNING"
echo "$want" > "$stamp"

#!/usr/bin/env bash
# Idempotent set-up of .venv/ for collage-ml.
#   scripts/setup.sh          core + openvino + mnn + ray + parquet + plots + test extras, and Graphviz's dot
# On a machine without an NVIDIA GPU it installs the CPU build of torch first
# (torch==2.13.0, a local wheel here) and xgboost-cpu; with a GPU it installs
# plain xgboost and lets torch resolve to its CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.collage-ml-setup
HASH=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HASH" ]; then
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# pip warns about every file:// index location it skips; keep the rest of stderr
PIP="pip_quiet $VENV/bin/python -m pip"
pip_quiet() { "$@" 2> >(grep -v "is ignored: it is neither" >&2); }
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  FLAVOUR=cuda
  $PIP install -q "torch==2.13.0"
else
  FLAVOUR=cpu
  # The CPU build first: any later requirement on torch is then already met.
  $PIP install -q "torch==2.13.0"
fi
$PIP install -q -e ".[$FLAVOUR,openvino,mnn,ray,parquet,plots,test]"
# Graphviz's dot lays out the plan pictures of `place --report` and `collage-ml show`; best effort
# (needs root and apt-get): without it, everything else works and drawing says how to install it.
if ! command -v dot >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz; }; } >/dev/null 2>&1 \
    || echo "setup.sh: could not install graphviz (apt-get); plan pictures need its dot" >&2
fi
echo "$HASH" > "$STAMP"

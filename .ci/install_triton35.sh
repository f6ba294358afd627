#!/usr/bin/env bash
# Triton 3.5.1 (what torch 2.9.1, AReaL 1.0.4's torch with SGLang 0.5.10.post1, pins) beside the CPU
# torch wheel, in its own venv, for tests/kernels/test_triton35.py (the op tests under Triton 3.5's interpreter).
# Usage: install_triton35.sh [MAIN_VENV]   -- creates ${TIK_TRITON35_VENV:-./.venv-t35}; .ci/run passes
# its own venv as the argument (unused here) and exports TIK_TRITON35_VENV for the test when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."
V=${TIK_TRITON35_VENV:-$(pwd)/.venv-t35}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
start=$(date +%s)
if [ -x "$V/bin/python" ] && "$V/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('triton') != '3.5.1')" 2>/dev/null; then
  echo "triton 3.5.1 venv already at $V"; exit 0
fi
[ -x "$V/bin/python" ] || "$PY" -m venv "$V"
PIP="$V/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
$PIP install -q torch==2.13.0
$PIP install -q --no-deps triton==3.5.1
$PIP install -q numpy pyyaml pytest packaging
$PIP install -q --no-deps -e .
echo "triton 3.5.1 venv at $V took $(( $(date +%s) - start )) s"

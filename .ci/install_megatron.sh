#!/usr/bin/env bash
# CI extra: megatron-core on CPU for tests/megatron/. Usage: install_megatron.sh VENV
# megatron-core 0.16.1 is the last release for Python 3.11 (0.17 needs >= 3.12, where AReaL pins
# 0.17.0). --no-deps so nothing can replace the project's CPU torch 2.13.0; its own requirements
# (torch, numpy, packaging) are already in VENV, einops is imported by its attention module.
# mbridge 0.15.1 (PyPI) for the AReaL/mbridge test: pure Python, no deps needed for what the tests
# call (AReaL pins a newer mbridge commit under the same version number).
set -euo pipefail
VENV=${1:?usage: install_megatron.sh VENV}
PY="$VENV/bin/python"
start=$(date +%s)
MCORE=$("$PY" -c "import sys; print('0.16.1' if sys.version_info < (3, 12) else '0.17.0')")
if "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('megatron-core') != '$MCORE' or m.version('mbridge') != '0.15.1')" 2>/dev/null \
   && "$PY" -c "import einops, megatron.core" 2>/dev/null; then
  echo "megatron-core $MCORE already installed"; exit 0
fi
"$PY" -m pip install -q --no-deps "megatron-core==$MCORE" mbridge==0.15.1
"$PY" -m pip install -q einops==0.8.2 packaging numpy
"$PY" -c "import torch, megatron.core as m; print('megatron-core', m.__version__, 'torch', torch.__version__)"
echo "megatron install took $(( $(date +%s) - start )) s"

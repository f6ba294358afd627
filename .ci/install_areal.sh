#!/usr/bin/env bash
# CI extra: AReaL 1.0.4 (pure-python wheel) on CPU for tests/integrations/test_areal_*.py. Usage: install_areal.sh VENV
# AReaL pins torch<2.11 and transformers<=5.3; the project runs CPU torch 2.13.0 and the transformers
# the project's test extra installs (SGLang 0.5.23's HTTP server needs >=5.4), so AReaL goes in with
# --no-deps plus the light deps its trainer, FSDP engine, SGLang client, RLVR workflow and stats
# logger import on CPU. swanlab/trackio (imported unconditionally by AReaL's stats logger) are
# import stubs in devenv/areal_cpu_stubs, put on PYTHONPATH by the tests.
# Independent of the order of .ci/install_*.sh: it installs SGLang first if absent.
set -euo pipefail
VENV=${1:?usage: install_areal.sh VENV}
HERE=$(cd "$(dirname "$0")" && pwd)
PY="$VENV/bin/python"
start=$(date +%s)
if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang') != '0.5.23')" 2>/dev/null \
   && [ -f "$HERE/install_sglang.sh" ]; then
  bash "$HERE/install_sglang.sh" "$VENV"
fi
if "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('areal') != '1.0.4')" 2>/dev/null \
   && "$PY" -c "import omegaconf, hydra, torchdata, ray, wandb, math_verify, matplotlib, prometheus_client" 2>/dev/null; then
  echo "areal 1.0.4 already installed"; exit 0
fi
"$PY" -m pip install -q --no-deps areal==1.0.4
"$PY" -m pip install -q \
  omegaconf==2.4.0.dev2 hydra-core==1.4.0.dev1 torchdata==0.11.0 datasets==5.2.0 math-verify==0.8.0 \
  peft==0.18.1 tabulate==0.10.0 tensorboardX==2.6.5 ray==2.60.0 aiofiles==25.1.0 colorlog==6.12.0 \
  flask==3.1.3 numba==0.68.1 lark==1.3.1 tenacity==9.2.1 msgpack==1.2.4 wandb==0.31.0 \
  matplotlib==3.11.2 prometheus_client==0.26.0
echo "areal install took $(( $(date +%s) - start )) s"

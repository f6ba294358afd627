#!/usr/bin/env bash
# SGLang 0.5.10.post1 (AReaL 1.0.4's pin: no plugin system, the plugin enters through
# areal_tik_plugin.integrations.sglang.launch) on CPU, in its own venv, for tests/integrations/test_sglang010.py.
# Usage: lane_sglang010.sh [VENV010]   (default: $TIK_SGLANG_010_VENV or ./.venv-sgl010)
# The venv has what AReaL 1.0.4's stack brings where it matters to the plugin: Triton 3.5.1 (torch
# 2.9.1's pin) and transformers 5.3.0 (SGLang 0.5.10.post1's pin, the top of AReaL's range), with the
# CPU torch 2.13.0 wheel (CUDA torch 2.9.1 is not installable here). SGLang goes in with --no-deps (its
# pins pull CUDA torch, sgl-kernel, flashinfer) plus the light deps its CPU import, Engine and HTTP
# server need; sgl_kernel, which 0.5.10 imports at module import even on CPU, is the import-only
# stand-in of devenv/gpu_stubs (put on PYTHONPATH by sglang_check.child_env).
# .ci/run builds it beside the main venv (not named install_*: those install into the main venv) and runs
# the version and HTTP-server tests there. The full proof (3 Engines in the interpreter, 927 s on a shared
# 2-core machine) is beyond the CI budget and runs with TIK_SGLANG_010_FULL=1:
#   bash .ci/lane_sglang010.sh /path/v010 && TIK_SGLANG_010_VENV=/path/v010 TIK_SGLANG_010_FULL=1 \
#     python -m pytest tests/integrations/test_sglang010.py
set -euo pipefail
cd "$(dirname "$0")/.."
V=${1:-${TIK_SGLANG_010_VENV:-$(pwd)/.venv-sgl010}}
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
start=$(date +%s)
if [ -x "$V/bin/python" ] && "$V/bin/python" -c "import importlib.metadata as m, sys; \
sys.exit(not (m.version('sglang') == '0.5.10.post1' and m.version('transformers') == '5.3.0' and m.version('triton') == '3.5.1'))" 2>/dev/null; then
  # the checkout's layout may have changed since the venv was made: its editable install is redone
  "$V/bin/python" -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null || "$V/bin/python" -m pip install -q --no-deps -e .
  echo "sglang 0.5.10.post1 venv already at $V"; exit 0
fi
[ -x "$V/bin/python" ] || "$PY" -m venv "$V"
PIP="$V/bin/python -m pip"
export PIP_DISABLE_PIP_VERSION_CHECK=1
$PIP install -q torch==2.13.0
$PIP install -q --no-deps triton==3.5.1
$PIP install -q --no-deps sglang==0.5.10.post1
$PIP install -q transformers==5.3.0 pytest numpy pyyaml
$PIP install -q \
  aiohttp==3.14.5 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 dill==0.4.1 einops==0.8.2 \
  fastapi==0.165.0 gguf==0.19.0 ipython==9.18.1 msgspec==0.23.0 openai==3.57.0 orjson==3.13.0 \
  partial-json-parser==0.2.1.1.post7 pillow==13.0.0 psutil==7.2.2 pybase64==1.5.1 \
  python-multipart==0.0.34 pyzmq==27.3.0 requests==2.34.2 sentencepiece==0.2.3 setproctitle==1.3.8 \
  soundfile==0.14.0 starlette==1.10.0 uvicorn==0.54.0 uvloop==0.23.0 xgrammar==0.1.32 \
  prometheus-client==0.26.0 pydantic scipy tqdm packaging jsonschema
$PIP install -q --no-deps --no-build-isolation -e . 2>/dev/null || $PIP install -q --no-deps -e .
echo "sglang 0.5.10.post1 venv at $V took $(( $(date +%s) - start )) s"

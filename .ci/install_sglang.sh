#!/usr/bin/env bash
# CI extra: SGLang 0.5.23 on CPU for the tests/integrations/test_sglang_*.py proof. Usage: install_sglang.sh VENV
# Run by .ci/run after the project install (torch 2.13.0 CPU, triton 3.6.0, transformers already in
# VENV; SGLang 0.5.23 runs with the transformers the project installs). SGLang goes in with --no-deps:
# its pins pull CUDA torch, sgl-kernel, flashinfer. These are the light deps its CPU import, Engine and
# HTTP server need, pinned. Import stubs (torchvision, vllm._custom_ops) ship in
# devenv/cpu_stubs and are put on PYTHONPATH by the tests / tik sglang-check.
set -euo pipefail
VENV=${1:?usage: install_sglang.sh VENV}
PIP="$VENV/bin/python -m pip"
start=$(date +%s)
if "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('sglang') != '0.5.23')" 2>/dev/null \
   && "$VENV/bin/python" -c "import xgrammar, msgspec, zmq" 2>/dev/null; then
  echo "sglang 0.5.23 already installed"; exit 0
fi
$PIP install -q --no-deps sglang==0.5.23
$PIP install -q \
  aiohttp==3.14.5 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 dill==0.4.1 einops==0.8.2 \
  fastapi==0.165.0 gguf==0.19.0 ipython==9.18.1 msgspec==0.23.0 openai==3.57.0 orjson==3.13.0 \
  partial-json-parser==0.2.1.1.post7 pillow==13.0.0 psutil==7.2.2 pybase64==1.5.1 \
  python-multipart==0.0.34 pyzmq==27.3.0 requests==2.34.2 sentencepiece==0.2.3 setproctitle==1.3.8 \
  soundfile==0.14.0 starlette==1.10.0 uvicorn==0.54.0 uvloop==0.23.0 xgrammar==0.2.7
echo "sglang install took $(( $(date +%s) - start )) s"

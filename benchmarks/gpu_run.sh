#!/usr/bin/env bash
# One GPU call: install the project offline, run the contract suite + benchmarks, write evidence JSON
# under $OUT, print a short table last. Usage: bash benchmarks/gpu_run.sh [--ops a,b] [--quick] [...]
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tik-out}
# the arguments go to python -m areal_tik_plugin.contract: refused (exit 2, with its usage) before any install
python3 -c "import sys; from areal_tik_plugin.contract.__main__ import build_parser, configure
try:
    configure(build_parser().parse_args(sys.argv[1:]))
except ValueError as e:
    sys.exit(f'gpu_run.sh: {e}')" --out "$OUT" "$@" || { echo "gpu_run.sh: see the header of benchmarks/gpu_run.sh" >&2; exit 2; }
mkdir -p "$OUT"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
python3 -m areal_tik_plugin.contract --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu.log"

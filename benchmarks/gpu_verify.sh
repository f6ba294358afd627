#!/usr/bin/env bash
# One GPU call for issue 4: `tik verify` on the model grid + the layer-level phase-time benchmark.
# JSON under $OUT (verify-*.json, layer_bench-*.json); a short table per step on stdout.
# Needs transformers (5.x) importable on the GPU machine (e.g. wheels in .whl/, installed below).
# Usage: bash benchmarks/gpu_verify.sh [quick|full|verify|bench]   (default quick: ~10 min of GPU time)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tik-out}
MODE=${1:-quick}
case "$MODE" in quick|full|verify|bench) ;;
  *) echo "gpu_verify.sh: unknown argument $MODE: expected quick, full, verify or bench (see the header of benchmarks/gpu_verify.sh)" >&2; exit 2;;
esac
[ $# -le 1 ] || { echo "gpu_verify.sh: one argument at most, got $* (see the header of benchmarks/gpu_verify.sh)" >&2; exit 2; }
mkdir -p "$OUT"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" || exit 1
rc=0
verify() {  # name, extra args...
  local name=$1; shift
  echo "== tik verify --model $name $*"
  timeout 900 python3 -m areal_tik_plugin.verify --model "$name" --out "$OUT/verify-$name.json" "$@" 2>&1 | tail -12
  local r=${PIPESTATUS[0]}; [ "$r" -eq 0 ] || rc=1
}
if [ "$MODE" != bench ]; then
  if [ "$MODE" = full ]; then
    verify qwen2.5-1.5b --prompt-len 1024 --response-len 128..1024 --batch 64
    verify qwen3-4b --prompt-len 1024 --response-len 128..1024 --batch 64
    verify qwen3-30b-a3b --layers 4 --prompt-len 1024 --response-len 128..1024 --batch 64
  else
    verify qwen2.5-1.5b --prompt-len 1024 --response-len 128..1024 --batch 16
    verify qwen3-4b --prompt-len 1024 --response-len 128..512 --batch 8
    verify qwen3-30b-a3b --layers 2 --prompt-len 1024 --response-len 128..256 --batch 8
  fi
fi
if [ "$MODE" != verify ]; then
  echo "== layer bench"
  if [ "$MODE" = full ]; then
    timeout 1800 python3 -m benchmarks.layer_bench --out "$OUT" || rc=1
  else
    timeout 600 python3 -m benchmarks.layer_bench --out "$OUT" --quick || rc=1
  fi
fi
exit $rc

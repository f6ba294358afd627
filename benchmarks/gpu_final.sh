#!/usr/bin/env bash
# The evidence call: attention (full contract suite + full benchmark grid) and every other op (full
# contract suite, --quick benchmark grid), two evidence JSON files under $OUT bound to the current
# source hash. Prints the two short tables last.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tik-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
# Liger-Kernel baseline for RMSNorm / RoPE / SwiGLU: carry .whl-liger (liger_kernel-0.8.5 wheel only, pure
# Python, installed without deps); without it the benchmark rows record Liger as unavailable
if ls .whl-liger/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-liger .whl-liger/*.whl >>"$OUT/pip.log" 2>&1 \
    && export PYTHONPATH=/tmp/site-liger${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# TIK_FINAL_ATTN_BENCH=0: attention contract checks without its benchmark grid (for a kernel change
# outside attention.py, whose benchmarks are then those of the last full run); =quick: the full checks
# with the --quick benchmark grid; TIK_FINAL_LAYER_BENCH=1: the layer bench (TIK_FINAL_LB_ARGS, default
# --quick) after the suites, its JSON and log under $OUT. Order: ops, attention, layer bench.
# TIK_FINAL_PARTS (default "ops attention"): run one part per device call when both do not fit in one
parts=" ${TIK_FINAL_PARTS:-ops attention} "
a=0; b=0; : >"$OUT/ops.log"; : >"$OUT/attention.log"
if [[ $parts == *" ops "* ]]; then
  python3 -m areal_tik_plugin.contract --out "$OUT" --ops rmsnorm,rope,swiglu,kv_write,logprob,gemm,moe --quick >"$OUT/ops.log" 2>&1; b=$?
fi
nb=; [ "${TIK_FINAL_ATTN_BENCH:-1}" = 0 ] && nb=--no-bench; [ "${TIK_FINAL_ATTN_BENCH:-1}" = quick ] && nb=--quick-bench
if [[ $parts == *" attention "* ]]; then
  python3 -m areal_tik_plugin.contract --out "$OUT" --ops attention $nb >"$OUT/attention.log" 2>&1; a=$?
fi
c=0
if [ "${TIK_FINAL_LAYER_BENCH:-0}" = 1 ]; then
  timeout "${TIK_LB_LIMIT:-200}" python3 -m benchmarks.layer_bench --out "$OUT" ${TIK_FINAL_LB_ARGS:---quick} >"$OUT/layer_bench.log" 2>&1; c=$?
fi
grep -E "^(FAIL|ERROR)" "$OUT/attention.log" "$OUT/ops.log" | cut -c1-300 | head -20
[ "${TIK_FINAL_LAYER_BENCH:-0}" = 1 ] && grep -E "ratio baseline|pdl probe|ERROR" "$OUT/layer_bench.log"
tail -4 "$OUT/attention.log"; tail -9 "$OUT/ops.log"
# at most 8 files come back from a device call (top-level files first, by name), so everything this
# script wrote also goes into one archive whose name sorts first
(cd "$OUT" && tar czf 00-final.tgz --exclude=./00-final.tgz --exclude=./bundle.tgz . 2>/dev/null) \
  || echo "could not pack $OUT/00-final.tgz"
exit $(( a | b | c ))

#!/usr/bin/env bash
# The evidence call: attention (full contract suite + full benchmark grid) and every other op (full
# contract suite, --quick benchmark grid), two evidence JSON files under $OUT bound to the current
# source hash. Prints the two short tables last.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tik-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -m areal_tik_plugin.gpu --out "$OUT" --ops attention >"$OUT/attention.log" 2>&1; a=$?
python3 -m areal_tik_plugin.gpu --out "$OUT" --ops rmsnorm,rope,swiglu,kv_write,logprob,gemm,moe --quick >"$OUT/ops.log" 2>&1; b=$?
grep -E "^(FAIL|ERROR)" "$OUT/attention.log" "$OUT/ops.log" | cut -c1-300 | head -20
tail -4 "$OUT/attention.log"; tail -9 "$OUT/ops.log"
exit $(( a | b ))

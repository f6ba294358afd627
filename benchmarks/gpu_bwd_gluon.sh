#!/usr/bin/env bash
# One device call for a Gluon attention backward (attention_bwd_gluon.py of --impl, default tik_v18):
#   1. its gradients: the contract suite's backward checks (tolerance table, repeat bits) at odd packed lengths and at
#      b4 x L 4224, bf16 / fp16 (benchmarks/probes/attn_bwd_gluon_check.py), bounded so that a hang ends this step only;
#   2. the training step (prefill forward with LSE + backward) against torch SDPA cuDNN and FA2 fwd+bwd in the same
#      process: tik_v13 (selected: the split backward kernels), tik_v18 (the first Gluon kernel) and --impl; with
#      --impl tik_v18 also its int32 fused Triton kernel (benchmarks/probes/attn_bwd_probe.py, cold L2, medians; rel
#      L2 against fp32 where T <= 8320).
#   bash benchmarks/gpu_bwd_gluon.sh [--impl tik_v19] [--cells 1x1152,4x4224,1x16512] (the default cells: the
#   README's training cells)
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tik-out}
cells=1x1152,4x4224,1x16512
impl=tik_v18
while [ $# -gt 0 ]; do
  case "$1" in
    --cells) cells=$2; shift 2;;
    --impl) impl=$2; shift 2;;
    *) echo "gpu_bwd_gluon.sh: unknown argument $1 (see the header of benchmarks/gpu_bwd_gluon.sh)" >&2; exit 2;;
  esac
done
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
[ -d "kernels/$impl" ] || { echo "gpu_bwd_gluon.sh: --impl $impl: no folder kernels/$impl" >&2; exit 2; }
impls=kernels/tik_v13,kernels/tik_v18
configs='[{"dq": "int32"}]'
[ "$impl" = tik_v18 ] || { impls=$impls,kernels/$impl; configs='[]'; }
TIK_IMPLEMENTATION=$impl timeout 120 python3 -m benchmarks.probes.attn_bwd_gluon_check --out "$OUT" >"$OUT/check.log" 2>&1
c=$?
echo "== check rc $c"; head -2 "$OUT/check.log"; grep -E "^FAIL|Error|error" "$OUT/check.log" | cut -c1-300 | head -8
p=0
if [ "$c" != 124 ]; then
  timeout 200 python3 -m benchmarks.probes.attn_bwd_probe --impls "$impls" \
    --configs "$configs" --cells "$cells" --out "$OUT" >"$OUT/probe.log" 2>&1
  p=$?
  echo "== probe rc $p"
fi
(cd "$OUT" && tar czf 00-bwd-gluon.tgz --exclude=./00-bwd-gluon.tgz . 2>/dev/null) || echo "could not pack $OUT"
tail -30 "$OUT/probe.log" 2>/dev/null | cut -c1-200
tail -14 "$OUT/check.log" | cut -c1-200
exit $(( (c != 0) | (p != 0) ))

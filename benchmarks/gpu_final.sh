#!/usr/bin/env bash
# The evidence call for the current source hash: the contract suite (checks + benchmarks) of every op,
# evidence JSON under $OUT bound to the hash, the short tables last.
#   bash benchmarks/gpu_final.sh [--parts "ops attention"] [--ops-grid full|quick|none] [--attn-bench full|quick|none]
#                                [--layer-bench] [--lb-args "--quick"] [--lb-limit 200]
# --parts: the groups to run (one per device call when both do not fit in one); --ops-grid: the benchmark
# grid of the non-attention ops (none: their checks alone); --attn-bench none: attention's checks without its
# benchmark grid;
# --layer-bench: the layer bench after the suites (its JSON and log under $OUT). Order: ops, attention,
# layer bench. Carry .whl-liger (the liger_kernel wheel alone) for the Liger-Kernel baseline rows.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tik-out}
parts="ops attention"; ops_grid=full; attn_bench=full; layer_bench=0; lb_args="--quick"; lb_limit=200
while [ $# -gt 0 ]; do
  case "$1" in
    --parts) parts=$2; shift 2;;
    --ops-grid) ops_grid=$2; shift 2;;
    --attn-bench) attn_bench=$2; shift 2;;
    --layer-bench) layer_bench=1; shift;;
    --lb-args) lb_args=$2; shift 2;;
    --lb-limit) lb_limit=$2; shift 2;;
    *) echo "gpu_final.sh: unknown argument $1 (see the header of benchmarks/gpu_final.sh)" >&2; exit 2;;
  esac
done
case "$ops_grid" in full) og=;; quick) og=--quick-bench;; none) og=--no-bench;;
  *) echo "--ops-grid: expected full, quick or none, got $ops_grid" >&2; exit 2;; esac
case "$attn_bench" in full) nb=;; quick) nb=--quick-bench;; none) nb=--no-bench;;
  *) echo "--attn-bench: expected full, quick or none, got $attn_bench" >&2; exit 2;; esac
mkdir -p "$OUT"
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
if ls .whl-liger/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-liger .whl-liger/*.whl >>"$OUT/pip.log" 2>&1 \
    && export PYTHONPATH=/tmp/site-liger${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
a=0; b=0; : >"$OUT/ops.log"; : >"$OUT/attention.log"
if [[ " $parts " == *" ops "* ]]; then
  python3 -m areal_tik_plugin.contract --out "$OUT" --ops rmsnorm,rope,swiglu,kv_write,logprob,gemm,moe $og >"$OUT/ops.log" 2>&1; b=$?
fi
if [[ " $parts " == *" attention "* ]]; then
  python3 -m areal_tik_plugin.contract --out "$OUT" --ops attention $nb >"$OUT/attention.log" 2>&1; a=$?
fi
c=0
if [ "$layer_bench" = 1 ]; then
  # shellcheck disable=SC2086
  timeout "$lb_limit" python3 -m benchmarks.layer_bench --out "$OUT" $lb_args >"$OUT/layer_bench.log" 2>&1; c=$?
fi
grep -E "^(FAIL|ERROR)" "$OUT/attention.log" "$OUT/ops.log" | cut -c1-300 | head -20
[ "$layer_bench" = 1 ] && grep -E "ratio baseline|pdl probe|ERROR" "$OUT/layer_bench.log"
tail -4 "$OUT/attention.log"; tail -9 "$OUT/ops.log"
# at most 8 files come back from a device call (top-level files first, by name), so everything this
# script wrote also goes into one archive whose name sorts first
(cd "$OUT" && tar czf 00-final.tgz --exclude=./00-final.tgz --exclude=./bundle.tgz . 2>/dev/null) \
  || echo "could not pack $OUT/00-final.tgz"
exit $(( a | b | c ))

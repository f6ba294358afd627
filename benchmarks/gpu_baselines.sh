#!/usr/bin/env bash
# One GPU call (nvidia-h200): every benchmark against the baselines a user would pick (issue 28's harness),
# evidence JSON under $OUT packed into $OUT/00-baselines.tgz, a short table last.
#
# Carried wheels (build here, carry in the device call):
#   python -m devenv.flashinfer_wheel .whl-fi       # trimmed flashinfer-python 0.7.4 + apache-tvm-ffi (~15 MiB)
#   python -m devenv.areal_gpu_wheels .whl-areal --import-deps   # areal 1.0.4 (its compiled log-prob), liger-kernel
#                                                   # and what `import areal` takes from the SGLang set (9.7 MiB)
#   device call: carry [".whl-fi", ".whl-areal"] (15.5 + 9.7 MiB + the 13.5 MiB tree = ~39 MiB); command:
#   bash benchmarks/gpu_baselines.sh   (.whl, the whole SGLang set (34 MiB), would not fit beside them)
#
# Steps and their estimated time on one H200 (from earlier runs of the same grids; the FlashInfer JIT
# build is an estimate, nvcc -j16): install 10 s; FlashInfer prebuild (parallel, background, <= TIK_FI_PREBUILD_S)
# ~150-240 s, overlapping GEMM (13 weights x 7 M, ~70 s) + MoE (~20 s) + log-prob (~40 s, AReaL's torch.compile);
# row ops rmsnorm/rope/swiglu/kv_write (~110 s with torch.compile baselines, --quick-bench T grid unless
# TIK_ROWOPS_FULL=1); attention full grid (~120 s); layer bench (~90 s, --quick). Every step runs under a
# timeout cut to what is left of TIK_DEADLINE_S (default 530 s), so the call ends in time and a cut
# step is reported, its JSON partial.
# Knobs: TIK_BASELINE_STEPS (default "gemm moe logprob rowops attention layer"), TIK_GEMM_M (comma list),
# TIK_BASELINES_OFF (flashinfer,liger,compile,areal,cudnn), TIK_FI_PREFILL_BACKENDS (default fa2,fa3),
# TIK_FI_PREBUILD_S (default 240), TIK_FI_PARALLEL=0 (prebuild before, not beside, the GEMM/MoE/log-prob steps),
# TIK_LAYER_ARGS (default "--quick --models qwen3-4b,qwen3-30b-a3b --decode 1024,4096").
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tik-out}
W=$OUT/w
mkdir -p "$W"
T0=$(date +%s)
DEADLINE=$(( T0 + ${TIK_DEADLINE_S:-530} ))
left() { echo $(( DEADLINE - $(date +%s) )); }
# the installs: one version per wheel name across the carried folders (two stop the whole install)
wheels=$(ls .whl-fi/*.whl .whl-areal/*.whl .whl/*.whl 2>/dev/null | awk -F/ '!seen[$NF]++')
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $wheels \
    >>"$W/pip.log" 2>&1 || { tail -20 "$W/pip.log"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# AReaL imports ray at module level: the import-only stub (devenv/areal_gpu_stubs) stands in for it
export PYTHONPATH=$PYTHONPATH:$PWD/devenv/areal_gpu_stubs:$PWD/devenv/areal_cpu_stubs
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$W/pip.log" 2>&1 || { tail -20 "$W/pip.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$W/gpu.txt"
# FlashInfer: JIT for sm_90a only, its cache inside the tree (an ignored folder: kept on a warm machine)
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a} FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-$PWD/.fi-cache}
export FLASHINFER_USE_CUDA_NORM=1
python3 - <<'EOF' 2>&1 | tee "$W/versions.txt"
from areal_tik_plugin.contract.baselines import versions
print(" ".join(f"{k}={v}" for k, v in versions().items()))
EOF
steps=" ${TIK_BASELINE_STEPS:-gemm moe logprob rowops attention layer} "
declare -A RC
step() {  # step NAME CAP CMD...: run under a timeout of min(CAP, what is left), log to $W/NAME.log
  local name=$1 cap=$2; shift 2
  local t=$(( $(left) - 10 )); [ $t -gt $cap ] && t=$cap
  if [ $t -lt 20 ]; then echo "== $name: skipped (deadline; $(left) s left)"; RC[$name]=skipped; return; fi
  local s=$(date +%s)
  echo "== $name (limit $t s)"
  timeout $t "$@" >"$W/$name.log" 2>&1; local r=$?
  RC[$name]=$r; [ $r -eq 124 ] && RC[$name]="timed out at $t s"
  echo "   $name: rc ${RC[$name]}, $(( $(date +%s) - s )) s"
}
fi_pid=
if python3 -c "import flashinfer" 2>/dev/null && [[ ",${TIK_BASELINES_OFF}," != *",flashinfer,"* ]]; then
  fi_t=${TIK_FI_PREBUILD_S:-240}
  python3 -m benchmarks.flashinfer_prebuild --out "$W/fi_prebuild.json" --timeout "$fi_t" --jobs 14 >"$W/fi_prebuild.log" 2>&1 &
  fi_pid=$!
  [ "${TIK_FI_PARALLEL:-1}" = 0 ] && { wait $fi_pid; fi_pid=; }
else
  echo "flashinfer: not importable or switched off; its baselines are recorded as skipped" | tee "$W/fi_prebuild.log"
fi
for s in gemm moe logprob; do
  [[ $steps == *" $s "* ]] || continue
  step "$s" 200 python3 -m areal_tik_plugin.contract --out "$W" --ops "$s" --no-checks
done
if [ -n "$fi_pid" ]; then
  wait $fi_pid
fi
if [ -f "$W/fi_prebuild.json" ]; then
  export TIK_FI_FAILED=$(python3 -c "import json,sys; print(','.join(json.load(open(sys.argv[1]))['failed']))" "$W/fi_prebuild.json")
  echo "flashinfer prebuild: $(tail -1 "$W/fi_prebuild.log")"
fi
if [[ $steps == *" rowops "* ]]; then
  qb=--quick-bench; [ "${TIK_ROWOPS_FULL:-0}" = 1 ] && qb=
  step rowops 200 python3 -m areal_tik_plugin.contract --out "$W" --ops rmsnorm,rope,swiglu,kv_write --no-checks $qb
fi
[[ $steps == *" attention "* ]] && step attention 200 python3 -m areal_tik_plugin.contract --out "$W" --ops attention --no-checks
[[ $steps == *" layer "* ]] && step layer 180 python3 -m benchmarks.layer_bench --out "$W" ${TIK_LAYER_ARGS:---quick --models qwen3-4b,qwen3-30b-a3b --decode 1024,4096}
# at most 8 files come back from a device call: everything goes into one archive whose name sorts first
(cd "$OUT" && tar czf 00-baselines.tgz w) || echo "could not pack $OUT/00-baselines.tgz"
echo; echo "== summary ($(( $(date +%s) - T0 )) s)"
for k in "${!RC[@]}"; do echo "step $k: rc ${RC[$k]}"; done | sort
python3 -m benchmarks.baselines_table "$W" 2>&1 | tail -40

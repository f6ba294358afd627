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
# build is an estimate, nvcc -j16): install 10 s; FlashInfer prebuild (parallel, background, <= --fi-prebuild-s)
# ~150-240 s, overlapping GEMM (13 weights x 7 M, ~70 s) + MoE (~20 s) + log-prob (~40 s, AReaL's torch.compile);
# row ops rmsnorm/rope/swiglu/kv_write (~110 s with torch.compile baselines, --quick-bench T grid unless
# --rowops-full); attention full grid (~120 s); layer bench (~90 s, --quick). Every step runs under a
# timeout cut to what is left of --deadline-s (default 530 s), so the call ends in time and a cut
# step is reported, its JSON partial.
# Options (an unknown one is refused):
#   --steps "LIST"             default "gemm moe logprob rowops attention layer"
#   --gemm-m LIST              comma list of GEMM M values (python -m areal_tik_plugin.contract --gemm-m)
#   --baselines-off LIST       families from flashinfer,liger,compile,areal,cudnn (every contract step, layer bench)
#   --fi-prefill-backends LIST default fa2,fa3 (the attention step)
#   --fi-prebuild-s S          default 240
#   --no-fi-parallel           prebuild before, not beside, the GEMM/MoE/log-prob steps
#   --rowops-full              the full row-op benchmark grid
#   --layer-args "ARGS"        default "--quick --models qwen3-4b,qwen3-30b-a3b --decode 1024,4096"
#   --deadline-s S             default 530
#   --dry-run                  print the command lines ("+ ..." each, shell-quoted) instead of running anything
set -o pipefail
export PYTHONUNBUFFERED=1
steps_opt="gemm moe logprob rowops attention layer"; gemm_m=; baselines_off=; fi_pb=; fi_pb_set=0; fi_prebuild_s=240
fi_parallel=1; rowops_full=0; layer_args="--quick --models qwen3-4b,qwen3-30b-a3b --decode 1024,4096"; deadline_s=530
dry=0
need() { [ $# -ge 2 ] || { echo "gpu_baselines.sh: $1 needs a value (see the header of benchmarks/gpu_baselines.sh)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) need "$@"; steps_opt=$2; shift 2;;
    --gemm-m) need "$@"; gemm_m=$2; shift 2;;
    --baselines-off) need "$@"; baselines_off=$2; shift 2;;
    --fi-prefill-backends) need "$@"; fi_pb=$2; fi_pb_set=1; shift 2;;
    --fi-prebuild-s) need "$@"; fi_prebuild_s=$2; shift 2;;
    --no-fi-parallel) fi_parallel=0; shift;;
    --rowops-full) rowops_full=1; shift;;
    --layer-args) need "$@"; layer_args=$2; shift 2;;
    --deadline-s) need "$@"; deadline_s=$2; shift 2;;
    --dry-run) dry=1; shift;;
    *) echo "gpu_baselines.sh: unknown argument $1 (see the header of benchmarks/gpu_baselines.sh)" >&2; exit 2;;
  esac
done
for v in deadline_s fi_prebuild_s; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "gpu_baselines.sh: --${v//_/-}: expected seconds, got ${!v}" >&2; exit 2; }
done
# --dry-run: x CMD prints the command line instead of running it
# shellcheck source=benchmarks/dryrun.sh
. "$(dirname "$0")/dryrun.sh"
OUT=${OUT:-/tmp/tik-out}
W=$OUT/w
mkdir -p "$W"
T0=$(date +%s)
DEADLINE=$(( T0 + deadline_s ))
left() { echo $(( DEADLINE - $(date +%s) )); }
off=(); [ -n "$baselines_off" ] && off=(--baselines-off "$baselines_off")
if [ $dry = 0 ]; then  # the installs and the versions line
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
fi
steps=" $steps_opt "
declare -A RC
step() {  # step NAME CAP CMD...: run under a timeout of min(CAP, what is left), log to $W/NAME.log
  local name=$1 cap=$2; shift 2
  local t=$(( $(left) - 10 )); [ $t -gt $cap ] && t=$cap
  if [ $t -lt 20 ]; then echo "== $name: skipped (deadline; $(left) s left)"; RC[$name]=skipped; return; fi
  local s=$(date +%s)
  echo "== $name (limit $t s)"
  x timeout $t "$@" >"$W/$name.log" 2>&1; local r=$?
  RC[$name]=$r; [ $r -eq 124 ] && RC[$name]="timed out at $t s"
  echo "   $name: rc ${RC[$name]}, $(( $(date +%s) - s )) s"
}
fi_pid=
# --dry-run counts FlashInfer as importable (the carried wheel), so that its prebuild line shows
if { [ $dry = 1 ] || python3 -c "import flashinfer" 2>/dev/null; } && [[ ",${baselines_off}," != *",flashinfer,"* ]]; then
  if [ $dry = 1 ]; then  # in the foreground: the printed lines keep their order
    x python3 -m benchmarks.flashinfer_prebuild --out "$W/fi_prebuild.json" --timeout "$fi_prebuild_s" --jobs 14
  else
    python3 -m benchmarks.flashinfer_prebuild --out "$W/fi_prebuild.json" --timeout "$fi_prebuild_s" --jobs 14 >"$W/fi_prebuild.log" 2>&1 &
    fi_pid=$!
  fi
  [ "$fi_parallel" = 0 ] && [ -n "$fi_pid" ] && { wait $fi_pid; fi_pid=; }
else
  echo "flashinfer: not importable or switched off; its baselines are recorded as skipped" | tee "$W/fi_prebuild.log"
fi
for s in gemm moe logprob; do
  [[ $steps == *" $s "* ]] || continue
  gm=(); [ "$s" = gemm ] && [ -n "$gemm_m" ] && gm=(--gemm-m "$gemm_m")
  step "$s" 200 python3 -m areal_tik_plugin.contract --out "$W" --ops "$s" --no-checks "${off[@]}" "${gm[@]}"
done
if [ -n "$fi_pid" ]; then
  wait $fi_pid
fi
fif=()  # the prebuild jobs that failed: their FlashInfer baselines are unavailable to the later steps
if [ -f "$W/fi_prebuild.json" ]; then
  fi_failed=$(python3 -c "import json,sys; print(','.join(json.load(open(sys.argv[1]))['failed']))" "$W/fi_prebuild.json")
  [ -n "$fi_failed" ] && fif=(--fi-failed "$fi_failed")
  echo "flashinfer prebuild: $(tail -1 "$W/fi_prebuild.log")"
fi
if [[ $steps == *" rowops "* ]]; then
  qb=(--quick-bench); [ "$rowops_full" = 1 ] && qb=()
  step rowops 200 python3 -m areal_tik_plugin.contract --out "$W" --ops rmsnorm,rope,swiglu,kv_write --no-checks "${qb[@]}" "${off[@]}" "${fif[@]}"
fi
fpb=(); [ "$fi_pb_set" = 1 ] && fpb=(--fi-prefill-backends "$fi_pb")
[[ $steps == *" attention "* ]] && step attention 200 python3 -m areal_tik_plugin.contract --out "$W" --ops attention --no-checks "${off[@]}" "${fif[@]}" "${fpb[@]}"
# shellcheck disable=SC2086  # --layer-args: split into words on purpose
[[ $steps == *" layer "* ]] && step layer 180 python3 -m benchmarks.layer_bench --out "$W" $layer_args "${off[@]}" "${fif[@]}"
if [ $dry = 1 ]; then x python3 -m benchmarks.baselines_table "$W"; rm -rf "$W"; exit 0; fi
# at most 8 files come back from a device call: everything goes into one archive whose name sorts first
(cd "$OUT" && tar czf 00-baselines.tgz w) || echo "could not pack $OUT/00-baselines.tgz"
echo; echo "== summary ($(( $(date +%s) - T0 )) s)"
for k in "${!RC[@]}"; do echo "step $k: rc ${RC[$k]}"; done | sort
python3 -m benchmarks.baselines_table "$W" 2>&1 | tail -40

#!/usr/bin/env bash
# GPU calls for the integration issues (SGLang proof, Liger baseline, AReaL recompute saving, verify grid,
# layer bench, knob search). Needs the carried wheels:
#   python -m devenv.sglang_wheels .whl       # SGLang 0.5.23 (trimmed) + deps
#   python -m devenv.areal_gpu_wheels .whl-areal   # areal 1.0.4 + light deps, liger-kernel
#   python -m devenv.megatron_wheels .whl-mcore    # megatron-core 0.17.0 + mbridge (the megatron step)
# Usage (device call, carry [".whl", ".whl-areal"]):
#   bash benchmarks/gpu_integrations.sh [OPTION...] STEP [STEP...]
#   e.g. bash benchmarks/gpu_integrations.sh --sgl-limit 400 --sgl-repeat 5 --no-sgl-tiny sglang verify-full
# STEPs: sglang | sglang-ab | sglang-profile | liger | recompute | verify-full | layer-bench | gemm-sweep | ops-quick | host | search | gsm8k | gsm8k-e2e | areal-bits | megatron
# OPTIONs (before the steps; an unknown one is refused; defaults in brackets):
#   --dry-run                print each command line ("+ ..." shell-quoted) instead of running it
#   --deadline-s S           seconds this call may take [none]; the search step keeps within it
#   sglang, sglang-ab, sglang-profile (benchmarks.sglang_gpu_proof):
#   --sgl-limit S            seconds per proof [sglang 390, sglang-ab and sglang-profile 200]
#   --sgl-repeat N           greedy jobs, median of the last N - 1 [sglang 6, sglang-ab 3, sglang-profile 6]
#   --sgl-shape NAME         [qwen3-4b]; qwen3-30b-a3b: the Qwen3-MoE path, --sgl-moe-layers layers [4]
#   --sgl-batch N [32]   --sgl-new N [128]   --sgl-baselines LIST (sglang; '' for none) [flashinfer]
#   --sgl-eager | --no-sgl-eager    no CUDA graphs [off]
#   --sgl-tiny | --no-sgl-tiny      sglang: a tiny eager run first, a failure shows in ~1 min [on]
#   --sgl-fi-prebuild | --no-sgl-fi-prebuild   sglang with the flashinfer baseline: the proof builds the
#                            FlashInfer modules of SGLang's flashinfer backend in the background while the
#                            tik engine runs (benchmarks.flashinfer_prebuild --only sglang) [on]
#   --pyspy-rate HZ          sglang-profile: py-spy samples per second [100]
#   ops-quick: --ops LIST [rope,attention]  --ops-limit S [240]
#   recompute: --rc-batch N [64]  --rc-steps N [3]  --rc-limit S [280]
#   verify-full: --verify-models "M [ARGS];M..." [qwen2.5-1.5b;qwen3-4b;qwen3-30b-a3b --layers 4]
#     --verify-limits "S S S" (per model, in order) [150 150 90]  --verify-batch N [64]
#     --verify-flags "ARGS" [--no-stock] (--verify-flags "" --verify-batch 8: with the stock comparison)
#   layer-bench: --lb-args "ARGS" [--quick]  --lb-limit S [500]
#   gemm-sweep: --gs-args "ARGS" []  --gs-limit S [300]
#   host: --host-limit S [120]
#   search: --search-name NAME [h200-knobs]  --search-budget-s S [300]
#     --search-reserve-s S [90]: with --deadline-s the budget is cut so that S seconds remain for later steps
#   gsm8k, gsm8k-e2e, areal-bits: --gpu-model DIR [/tmp/tik-random-qwen3-1.7b] (built when absent)
#     --gsm8k-modes "LIST" [baseline tik]  --gsm8k-limit S per mode [gsm8k 240, gsm8k-e2e 540]
#     --gsm8k-model-group NAME [gsm8k gpu-random-qwen3, gsm8k-e2e gpu-e2e-qwen3]
#     --gsm8k-build "ARGS" (areal_tik_plugin.models) [--shape qwen3-1.7b --device cuda]
#     --gsm8k-data DIR [tests/data/gsm8k_tiny]  --gsm8k-args "HYDRA OVERRIDES" []
#     --e2e-attn-impl NAME     gsm8k-e2e: the FSDP attention [flash_attention_2; sdpa when flash_attn is not importable]
#   areal-bits: --bits-sglang | --no-bits-sglang    part A (SGLang vs HF) as well as part B [on]
#   megatron (carry .whl-mcore, built with `python -m devenv.megatron_wheels .whl-mcore`):
#     --mg-model NAME [qwen3-4b]  --mg-layers N (verify; [all of the model's])  --mg-batch N [64]
#     --mg-verify-limit S [170]  --mg-bench-limit S [110]
#     --mg-bench-args "ARGS" (benchmarks.megatron_bench) [--layers 8 --micro-batch 4 --seq-len 2048 --steps 5 --warmup 2]
#     with --deadline-s: the verify limit leaves --mg-bench-reserve-s S [100] for the bench, which skips the
#     variants that would start within 20 s of the deadline
# (ops-quick: contract checks + --quick benchmark grid of --ops, a probe, not the evidence call)
# (gsm8k: kind nvidia-h200-x2, wheels built with `devenv.areal_gpu_wheels .whl-areal --trainer`;
#  about 150-200 s per mode, --gsm8k-limit 240 s each)
# gsm8k-e2e, one call on kind nvidia-h200-x2, carry [".whl", ".whl-areal", ".whl-fi"], timeout 600:
#   bash benchmarks/gpu_integrations.sh gsm8k-e2e
#  built here with
#   python -m devenv.sglang_wheels .whl                        # 34.4 MiB (SGLang trimmed + deps)
#   python -m devenv.areal_gpu_wheels .whl-areal --trainer     #  4.7 MiB (AReaL + trainer deps, no wandb)
#   python -m devenv.flashinfer_wheel .whl-fi --no-deps        # 13.4 MiB (FlashInfer trimmed)
#  + the tracked tree 7.7 MiB = 60.1 MiB of the 64 MiB limit (3.9 MiB free), measured with
#  `python -m devenv.carry --plan gsm8k-e2e` (which also refuses a stale wheel, e.g. wandb, left in a folder);
#  the step prints the carry as it arrived. W&B is disabled in the GPU cells: wandb's import-only stand-in
#  (devenv/areal_gpu_stubs/wandb) takes AReaL's init/log/finish in that mode and raises on anything else.
# --dry-run counts every carried wheel as present, flash_attn as not importable and the model as absent.
# Everything lands in $OUT/bundle.tgz (plus the step JSONs next to it); a short table per step on stdout.
set -o pipefail
export PYTHONUNBUFFERED=1
dry=0; deadline_s=
sgl_limit=; sgl_repeat=; sgl_shape=qwen3-4b; sgl_batch=32; sgl_new=128; sgl_baselines=flashinfer; sgl_eager=0
sgl_tiny=1; sgl_moe_layers=; pyspy_rate=100; sgl_fi_prebuild=1
ops=rope,attention; ops_limit=240
rc_batch=64; rc_steps=3; rc_limit=280
verify_models="qwen2.5-1.5b;qwen3-4b;qwen3-30b-a3b --layers 4"; verify_limits="150 150 90"; verify_batch=64
verify_flags=--no-stock
lb_args=--quick; lb_limit=500; gs_args=; gs_limit=300; host_limit=120
search_name=h200-knobs; search_budget_s=300; search_reserve_s=90
gpu_model=/tmp/tik-random-qwen3-1.7b; gsm8k_modes="baseline tik"; gsm8k_limit=; gsm8k_model_group=
gsm8k_build="--shape qwen3-1.7b --device cuda"; gsm8k_data=$PWD/tests/data/gsm8k_tiny; gsm8k_args=; e2e_attn_impl=
bits_sglang=1
mg_model=qwen3-4b; mg_layers=; mg_batch=64; mg_verify_limit=170; mg_bench_limit=110; mg_bench_reserve_s=100
mg_bench_args="--layers 8 --micro-batch 4 --seq-len 2048 --steps 5 --warmup 2"
need() { [ $# -ge 2 ] || { echo "gpu_integrations.sh: $1 needs a value (see the header of benchmarks/gpu_integrations.sh)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break;;
    --dry-run) dry=1; shift;;
    --deadline-s) need "$@"; deadline_s=$2; shift 2;;
    --sgl-limit) need "$@"; sgl_limit=$2; shift 2;;
    --sgl-repeat) need "$@"; sgl_repeat=$2; shift 2;;
    --sgl-shape) need "$@"; sgl_shape=$2; shift 2;;
    --sgl-batch) need "$@"; sgl_batch=$2; shift 2;;
    --sgl-new) need "$@"; sgl_new=$2; shift 2;;
    --sgl-baselines) need "$@"; sgl_baselines=$2; shift 2;;
    --sgl-moe-layers) need "$@"; sgl_moe_layers=$2; shift 2;;
    --sgl-eager) sgl_eager=1; shift;;
    --no-sgl-eager) sgl_eager=0; shift;;
    --sgl-tiny) sgl_tiny=1; shift;;
    --no-sgl-tiny) sgl_tiny=0; shift;;
    --sgl-fi-prebuild) sgl_fi_prebuild=1; shift;;
    --no-sgl-fi-prebuild) sgl_fi_prebuild=0; shift;;
    --pyspy-rate) need "$@"; pyspy_rate=$2; shift 2;;
    --ops) need "$@"; ops=$2; shift 2;;
    --ops-limit) need "$@"; ops_limit=$2; shift 2;;
    --rc-batch) need "$@"; rc_batch=$2; shift 2;;
    --rc-steps) need "$@"; rc_steps=$2; shift 2;;
    --rc-limit) need "$@"; rc_limit=$2; shift 2;;
    --verify-models) need "$@"; verify_models=$2; shift 2;;
    --verify-limits) need "$@"; verify_limits=$2; shift 2;;
    --verify-batch) need "$@"; verify_batch=$2; shift 2;;
    --verify-flags) need "$@"; verify_flags=$2; shift 2;;
    --lb-args) need "$@"; lb_args=$2; shift 2;;
    --lb-limit) need "$@"; lb_limit=$2; shift 2;;
    --gs-args) need "$@"; gs_args=$2; shift 2;;
    --gs-limit) need "$@"; gs_limit=$2; shift 2;;
    --host-limit) need "$@"; host_limit=$2; shift 2;;
    --search-name) need "$@"; search_name=$2; shift 2;;
    --search-budget-s) need "$@"; search_budget_s=$2; shift 2;;
    --search-reserve-s) need "$@"; search_reserve_s=$2; shift 2;;
    --gpu-model) need "$@"; gpu_model=$2; shift 2;;
    --gsm8k-modes) need "$@"; gsm8k_modes=$2; shift 2;;
    --gsm8k-limit) need "$@"; gsm8k_limit=$2; shift 2;;
    --gsm8k-model-group) need "$@"; gsm8k_model_group=$2; shift 2;;
    --gsm8k-build) need "$@"; gsm8k_build=$2; shift 2;;
    --gsm8k-data) need "$@"; gsm8k_data=$2; shift 2;;
    --gsm8k-args) need "$@"; gsm8k_args=$2; shift 2;;
    --e2e-attn-impl) need "$@"; e2e_attn_impl=$2; shift 2;;
    --bits-sglang) bits_sglang=1; shift;;
    --no-bits-sglang) bits_sglang=0; shift;;
    --mg-model) need "$@"; mg_model=$2; shift 2;;
    --mg-layers) need "$@"; mg_layers=$2; shift 2;;
    --mg-batch) need "$@"; mg_batch=$2; shift 2;;
    --mg-verify-limit) need "$@"; mg_verify_limit=$2; shift 2;;
    --mg-bench-limit) need "$@"; mg_bench_limit=$2; shift 2;;
    --mg-bench-reserve-s) need "$@"; mg_bench_reserve_s=$2; shift 2;;
    --mg-bench-args) need "$@"; mg_bench_args=$2; shift 2;;
    -*) echo "gpu_integrations.sh: unknown option $1 (see the header of benchmarks/gpu_integrations.sh)" >&2; exit 2;;
    *) break;;
  esac
done
for a in "$@"; do
  case "$a" in -*) echo "gpu_integrations.sh: option $a after the step names (options go first; see the header of benchmarks/gpu_integrations.sh)" >&2; exit 2;; esac
done
for v in deadline_s sgl_limit sgl_repeat sgl_batch sgl_new sgl_moe_layers pyspy_rate ops_limit rc_batch rc_steps rc_limit \
         verify_batch lb_limit gs_limit host_limit search_budget_s search_reserve_s gsm8k_limit \
         mg_layers mg_batch mg_verify_limit mg_bench_limit mg_bench_reserve_s; do
  [[ -z ${!v} || ${!v} =~ ^[0-9]+$ ]] || { echo "gpu_integrations.sh: --${v//_/-}: expected a whole number, got ${!v}" >&2; exit 2; }
done
# --dry-run: x CMD prints the command line instead of running it
# shellcheck source=benchmarks/dryrun.sh
. "$(dirname "$0")/dryrun.sh"
OUT=${OUT:-/tmp/tik-out}
mkdir -p "$OUT/w"
W=$OUT/w
if [ $dry = 0 ]; then
  for d in .whl .whl-areal .whl-fi .whl-mcore; do
    if ls $d/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $d/*.whl \
        >>"$W/pip.log" 2>&1 || { tail -20 "$W/pip.log"; exit 1; }
    fi
  done
fi
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
if [ $dry = 0 ]; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$W/pip.log" 2>&1 || { tail -20 "$W/pip.log"; exit 1; }
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
fi
STUBS=$PWD/devenv/areal_gpu_stubs:$PWD/devenv/areal_cpu_stubs
moe=(); [ -n "$sgl_moe_layers" ] && moe=(--moe-layers "$sgl_moe_layers")
attn_override=  # gsm8k-e2e's FSDP attention (a Hydra override; kept for the steps after it, as its model group is)
rc=0
for step in "$@"; do
  t0=$(date +%s)
  echo "== $step"
  # the AReaL steps import orjson, pydantic, ... from the SGLang set (.whl) as well as AReaL's own (.whl-areal)
  case $step in
    recompute|areal-bits|gsm8k|gsm8k-e2e)
      for d in .whl .whl-areal; do
        [ $dry = 1 ] && break
        ls $d/*.whl >/dev/null 2>&1 || { echo "$step: no wheels in $d (carry both .whl and .whl-areal)"; rc=1; continue 2; }
      done;;
  esac
  case $step in
    sglang)
      # --sgl-tiny: a tiny eager run first (a failure shows in ~1 min); then the qwen3-4b-shaped proof
      # (--sgl-baselines: stock backends timed on the same jobs, default flashinfer with FlashInfer-served
      # fused ops -- carry .whl-fi too, built with `devenv.flashinfer_wheel .whl-fi --no-deps` so that .whl, .whl-fi
      # and the tree stay under 64 MiB (apache-tvm-ffi comes with .whl); --sgl-repeat: greedy jobs, median of the last - 1;
      # --sgl-eager: no CUDA graphs; --sgl-shape qwen3-30b-a3b: the Qwen3-MoE model path, --sgl-moe-layers layers, default 4)
      r=0
      if [ "$sgl_tiny" = 1 ]; then
        x timeout 170 python3 -m benchmarks.sglang_gpu_proof --out "$W/tiny" --stub-sgl-kernel \
          --shape tiny --batch 8 --new 32 --baselines "" --timeout 150 --engine-arg disable_cuda_graph=true >"$W/sglang-tiny.log" 2>&1
        r=$?; tail -4 "$W/sglang-tiny.log"
      fi
      if [ $r -eq 0 ] || [ $r -eq 3 ]; then
        eager=; [ "$sgl_eager" = 1 ] && eager="--engine-arg disable_cuda_graph=true"
        fipre=; [ "$sgl_fi_prebuild" = 0 ] && fipre=--no-fi-prebuild
        lim=${sgl_limit:-390}
        # shellcheck disable=SC2086  # $eager: two words on purpose
        x timeout "$lim" python3 -m benchmarks.sglang_gpu_proof --out "$W" --stub-sgl-kernel \
          --shape "$sgl_shape" --batch "$sgl_batch" --new "$sgl_new" --baselines "$sgl_baselines" \
          --repeat "${sgl_repeat:-6}" --timeout $(( lim - 20 )) $eager $fipre "${moe[@]}" >"$W/sglang.log" 2>&1 || rc=1
        grep -E "Error|error:|Traceback" "$W/sglang.log" | head -8; grep "flashinfer prebuild" "$W/sglang.log"
        tail -6 "$W/sglang.log"
      else
        rc=1; grep -E "Error|error:|Traceback|stub" "$W/sglang-tiny.log" | tail -12
      fi;;
    sglang-ab)
      # the short launch path A/B in one call (same host): the tik-only proof with TIK_FAST_LAUNCH=1, then =0
      lim=${sgl_limit:-200}
      for fl in 1 0; do
        TIK_FAST_LAUNCH=$fl x timeout "$lim" python3 -m benchmarks.sglang_gpu_proof \
          --out "$W/fast$fl" --stub-sgl-kernel --shape "$sgl_shape" --batch "$sgl_batch" \
          --new "$sgl_new" --baselines "" --repeat "${sgl_repeat:-3}" \
          --timeout $(( lim - 20 )) "${moe[@]}" >"$W/sglang-fast$fl.log" 2>&1 || rc=1
        echo "-- TIK_FAST_LAUNCH=$fl"; grep -E "^tik|bitwise|Error|Traceback" "$W/sglang-fast$fl.log" | head -5
      done;;
    sglang-profile)
      # where the host time of SGLang's tik decode goes: py-spy (carry its wheel in .whl) samples every process
      # of the tik-only proof with --sgl-repeat (default 6) greedy jobs (not under `timeout`: py-spy attaches
      # to the Python process; a watchdog ends it after --sgl-limit s); raw stacks + benchmarks/probes/pyspy_summary.py
      lim=${sgl_limit:-200}
      proof=(python3 -m benchmarks.sglang_gpu_proof --out "$W/prof" --stub-sgl-kernel
        --shape "$sgl_shape" --batch "$sgl_batch" --new "$sgl_new" --baselines ""
        --repeat "${sgl_repeat:-6}" --timeout $(( lim - 20 )) "${moe[@]}")
      spy=(py-spy record --subprocesses --nonblocking --rate "$pyspy_rate" --format raw -o "$W/pyspy-raw.txt" --pid)
      if [ $dry = 1 ]; then
        show "${proof[@]}"; show "${spy[@]}" PID; : >"$W/sglang-profile.log"; : >"$W/pyspy.log"
      else  # not through x: $! must be the Python process itself (py-spy attaches to it, the watchdog kills it)
        "${proof[@]}" >"$W/sglang-profile.log" 2>&1 &
        pid=$!
        ( sleep "$lim"; kill "$pid" 2>/dev/null ) & dog=$!
        PATH=/tmp/site/bin:$PATH "${spy[@]}" "$pid" >"$W/pyspy.log" 2>&1 &
        spy_pid=$!
        wait "$pid" || rc=1
        kill "$dog" 2>/dev/null; wait "$spy_pid"
      fi
      grep -E "^tik|bitwise|Error|Traceback" "$W/sglang-profile.log" | head -5; tail -2 "$W/pyspy.log"
      x python3 benchmarks/probes/pyspy_summary.py "$W/pyspy-raw.txt" --top 30 --json "$W/pyspy-summary.json" >"$W/pyspy-summary.txt" \
        && head -80 "$W/pyspy-summary.txt" | cut -c1-150;;
    liger)
      x python3 -m areal_tik_plugin.contract --out "$W" --ops rmsnorm,rope,swiglu --quick >"$W/liger.log" 2>&1 || rc=1
      grep -E "^(FAIL|ERROR)|liger" "$W/liger.log" | head -12; tail -5 "$W/liger.log";;
    recompute)
      for mode in baseline tik; do
        flag=(); [ $mode = tik ] && flag=(--tik)
        PYTHONPATH=$PYTHONPATH:$STUBS x timeout "$rc_limit" torchrun --nproc-per-node 1 recipes/bench_recompute.py "${flag[@]}" \
          --batch "$rc_batch" --steps "$rc_steps" --out "$W/recompute-$mode.json" \
          >"$W/recompute-$mode.log" 2>&1 || rc=1
        echo "-- $mode"; grep -E "Error|Traceback" "$W/recompute-$mode.log" | head -5
        grep -E '"(recompute_s|update_s|step_with_recompute_s|step_without_recompute_s|saving_fraction)"' "$W/recompute-$mode.log"
      done;;
    verify-full)
      # plugin path only by default: the stock comparison (HF cached decode) at batch 64 x 1K responses did
      # not finish in 180 s per model; --verify-flags "" --verify-batch 8 runs it
      # shellcheck disable=SC2206  # split into words on purpose
      lim=($verify_limits)  # seconds per model, in this order (--verify-models: ';'-list)
      i=0
      IFS=';' read -ra models <<< "$verify_models"
      for m in "${models[@]}"; do
        set -- $m
        # shellcheck disable=SC2086  # $m, $verify_flags: words on purpose
        x timeout "${lim[$i]}" python3 -m areal_tik_plugin.verify --model $m --prompt-len 1024 --response-len 128..1024 \
          --batch "$verify_batch" $verify_flags --out "$W/verify-$1.json" >"$W/verify-$1.log" 2>&1 || rc=1
        tail -3 "$W/verify-$1.log"; i=$((i + 1))
      done;;
    layer-bench)
      # shellcheck disable=SC2086
      x timeout "$lb_limit" python3 -m benchmarks.layer_bench --out "$W" $lb_args >"$W/layer_bench.log" 2>&1 || rc=1
      tail -20 "$W/layer_bench.log";;
    gemm-sweep)
      # shellcheck disable=SC2086
      x timeout "$gs_limit" python3 -m benchmarks.gemm_sweep --out "$W" $gs_args >"$W/gemm_sweep.log" 2>&1 || rc=1
      grep -vE "^\s*$" "$W/gemm_sweep.log" | tail -66 | cut -c1-150;;
    ops-quick)
      x timeout "$ops_limit" python3 -m areal_tik_plugin.contract --out "$W" --ops "$ops" --quick \
        >"$W/ops-quick.log" 2>&1 || rc=1
      grep -E "^(FAIL|ERROR)" "$W/ops-quick.log" | cut -c1-300 | head -10; tail -12 "$W/ops-quick.log";;
    host)
      x timeout "$host_limit" python3 -m benchmarks.host_overhead --out "$W" >"$W/host.log" 2>&1 || rc=1
      head -12 "$W/host.log"; grep -A30 "ncalls" "$W/host.log" | cut -c1-150;;
    gsm8k-e2e)
      # the end-to-end cell (recipes/gsm8k/model/gpu-e2e-qwen3.yaml; kind nvidia-h200-x2, carry .whl, .whl-areal
      # built with --trainer, .whl-fi built with --no-deps; W&B disabled, wandb's import-only stand-in in
      # devenv/areal_gpu_stubs, metrics in tik_stats.jsonl; sizes in the header): NCCL weight updates, AReaL's default FSDP attention (flash_attention_2;
      # sdpa, said here, when flash_attn is not importable), 1 warm-up + 20 measured steps, baseline = stock SGLang
      # on FlashInfer attention with FlashInfer-served fused ops when FlashInfer is carried. Both modes in this
      # one step (--gsm8k-modes baseline / tik runs one per device call if both do not fit in 10 min).
      gsm8k_model_group=${gsm8k_model_group:-gpu-e2e-qwen3} gsm8k_limit=${gsm8k_limit:-540}
      # what this call carried (there: as it arrived; with --dry-run: this checkout's, before the call)
      python3 -m devenv.carry .whl .whl-areal .whl-fi || echo "carry over the device's limit (devenv/carry.py)"
      if [ $dry = 1 ] || ! python3 -c "import flash_attn" 2>/dev/null; then
        e2e_attn_impl=${e2e_attn_impl:-sdpa}
        echo "flash_attn not importable: FSDP attn_impl=$e2e_attn_impl (AReaL's default flash_attention_2 needs it)"
      fi
      [ -n "$e2e_attn_impl" ] && attn_override=actor.attn_impl=$e2e_attn_impl  # ref follows actor in that group
      ;&
    gsm8k)
      # the GSM8K GRPO recipe, staleness 0, baseline (AReaL recompute, stock SGLang: Triton attention +
      # torch-native ops, no sgl-kernel) then tik, on a random full-size Qwen3 (recipes/gsm8k/model/
      # gpu-random-qwen3.yaml: SGLang on GPU 0, FSDP on GPU 1, disk weight updates, 4 steps of 8x8 samples
      # x 512 tokens, step 0 = warm-up). Parity reward (a random model scores 0 on GSM8K). Per mode: one
      # summary line (tok/s, step time, phases); $W/gsm8k-summary.json + `tik compare` report in the bundle.
      # CPU rehearsal: --gsm8k-model-group cpu-tiny --gsm8k-build "" --gpu-model DIR
      if [ $dry = 1 ] || [ ! -f "$gpu_model/config.json" ]; then
        # shellcheck disable=SC2086  # --gsm8k-build: words on purpose
        x timeout 200 python3 -m areal_tik_plugin.models "$gpu_model" qwen3 \
          $gsm8k_build >"$W/gsm8k-build.log" 2>&1 || { rc=1; tail -5 "$W/gsm8k-build.log"; }
      fi
      if [ $dry = 0 ]; then  # the carried wandb, else the stand-in for W&B-disabled runs (devenv/areal_gpu_stubs)
        PYTHONPATH=$PYTHONPATH:$STUBS python3 -c "import wandb; print('wandb', wandb.__version__, wandb.__file__)"
      fi
      runs=
      for mode in $gsm8k_modes; do
        [ $dry = 1 ] || [ -f "$gpu_model/config.json" ] || break
        d=$W/gsm8k-$mode; mkdir -p "$d"; [ $dry = 1 ] || rm -rf /tmp/gsm8k-$mode
        # the model and data are Hydra overrides (actor.path, train_dataset.path: tokenizer, ref and the valid
        # split follow them in the recipe); the reward function is TIK_REWARD_FN, read by recipes/gsm8k_rl.py
        # shellcheck disable=SC2086  # $attn_override, --gsm8k-args: words on purpose
        PYTHONPATH=$PWD/devenv/gpu_stubs:$PYTHONPATH:$STUBS SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 \
          SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
          TRANSFORMERS_OFFLINE=1 TIK_REWARD_FN=areal_tik_plugin.integrations.areal.testing.parity_reward_fn \
          x timeout -k 60 "${gsm8k_limit:-240}" python3 -m areal_tik_plugin.run --spmd --log-dir "$d" recipes/gsm8k_rl.py \
          --config recipes/gsm8k/config.yaml model=${gsm8k_model_group:-gpu-random-qwen3} algorithm=grpo staleness=s0 \
          mode=$mode cluster.fileroot=/tmp/gsm8k-$mode/fr cluster.name_resolve.nfs_record_root=/tmp/gsm8k-$mode/nr \
          trial_name=gpu-$mode tik.stats_jsonl=$d/tik_stats.jsonl actor.path=$gpu_model train_dataset.path=$gsm8k_data \
          $attn_override $gsm8k_args >"$W/gsm8k-$mode.log" 2>&1
        r=$?; [ $r -eq 0 ] || rc=1
        echo "-- $mode (exit $r, $(( $(date +%s) - t0 )) s into the step)"
        grep -E "\[tik\] (GPUs|SGLang|plugin)" "$W/gsm8k-$mode.log" | grep -v "dropped arguments" | head -4
        if [ $r -ne 0 ]; then  # the trainer's first errors, then the server's
          grep -E "Error|Traceback" "$W/gsm8k-$mode.log" | head -6
          grep -hE "Error|error:|Traceback|stub" "$d"/sglang_*.log 2>/dev/null | grep -v "Connection refused\|freeze_gc" | head -6
        fi
        x python3 -m areal_tik_plugin.integrations.areal.summary "$d/tik_stats.jsonl" || rc=1
        runs="$runs $d/tik_stats.jsonl"
        if [ $dry = 0 ]; then
          nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | head -4  # leftovers
          rm -rf /tmp/gsm8k-$mode  # weight-update checkpoints, rollout dumps
        fi
      done
      if [ -n "$runs" ]; then
        echo "-- summary (steps after the warm-up)"
        # shellcheck disable=SC2086
        x python3 -m areal_tik_plugin.integrations.areal.summary $runs --json "$W/gsm8k-summary.json" || rc=1
        # shellcheck disable=SC2086
        x python3 -m areal_tik_plugin.cli compare $runs -o "$W/gsm8k-compare" >/dev/null 2>&1 || echo "(tik compare failed)"
      fi;;
    areal-bits)
      # where rollout and training part when the GSM8K GPU run's monitor sees differing tokens
      # at step 0: A = SGLang Engine (tik) vs the plain plugin-patched HF packed forward on that
      # run's model and SGLang settings (no chunked prefill, no radix cache, context 1024, 64 running);
      # B = AReaL's FSDP actor compute_logp vs the same HF forward (no SGLang)
      { [ $dry = 0 ] && [ -f "$gpu_model/config.json" ]; } || x timeout 200 python3 -m areal_tik_plugin.models \
        "$gpu_model" qwen3 --shape qwen3-1.7b --device cuda >"$W/bits-build.log" 2>&1 || { rc=1; tail -3 "$W/bits-build.log"; }
      if [ "$bits_sglang" = 1 ]; then  # --no-bits-sglang: part B only
        x timeout 220 python3 -m benchmarks.sglang_gpu_proof --out "$W/bits-sglang" --stub-sgl-kernel \
          --model-dir "$gpu_model" --batch 64 --prefix 300 --new 128 --baselines "" --timeout 200 \
          --engine-arg chunked_prefill_size=-1 --engine-arg disable_radix_cache=true --engine-arg context_length=1024 \
          >"$W/bits-sglang.log" 2>&1 || rc=1
        echo "-- A: SGLang (tik) vs plain patched HF"; grep -E "Error|Traceback" "$W/bits-sglang.log" | head -3; tail -2 "$W/bits-sglang.log"
      fi
      PYTHONPATH=$PYTHONPATH:$STUBS x timeout 200 torchrun --nproc-per-node 1 recipes/bench_recompute.py --tik \
        --model-dir "$gpu_model" --check-bits 16 --batch 16 --prompt 36 --response 512 --steps 1 --warmup 0 \
        --out "$W/bits-areal.json" >"$W/bits-areal.log" 2>&1 || rc=1
      echo "-- B: AReaL FSDP actor vs plain patched HF"; grep -E "check_bits|Error|Traceback" "$W/bits-areal.log" | cut -c1-1500 | head -5;;
    megatron)
      # issue 32 step 5: megatron-core as AReaL pins it (.whl-mcore), (a) tik verify --engine megatron on
      # --mg-model (random weights) at batch --mg-batch, prompt 1024, responses 128..1024, every sequence vs
      # the rollout replay and the patched HF forward (16K-token micro-batches; the shortest and longest
      # sequence also alone and through the training forward); (b) fwd+bwd tokens/s of the plugin spec vs
      # megatron-core's local TE-free spec and stock HF/SDPA (benchmarks/megatron_bench.py)
      if [ $dry = 0 ] && ! ls .whl-mcore/*.whl >/dev/null 2>&1; then
        echo "megatron: no wheels in .whl-mcore (python -m devenv.megatron_wheels .whl-mcore; carry it)"; rc=1; continue
      fi
      x python3 -c "import megatron.core as m, torch; print('megatron-core', m.__version__, 'torch', torch.__version__)" \
        || { rc=1; continue; }
      vlim=$mg_verify_limit blim=$mg_bench_limit
      if [ -n "$deadline_s" ]; then
        left=$(( deadline_s - SECONDS - mg_bench_reserve_s )); [ $left -lt $vlim ] && vlim=$left
      fi
      lay=(); [ -n "$mg_layers" ] && lay=(--layers "$mg_layers")
      x timeout "$vlim" python3 -m areal_tik_plugin.verify --engine megatron --model "$mg_model" "${lay[@]}" \
        --prompt-len 1024 --response-len 128..1024 --batch "$mg_batch" --single 2 --max-tokens-per-forward 16384 \
        --out "$W/megatron-verify.json" >"$W/megatron-verify.log" 2>&1 || rc=1
      grep -E "Error|Traceback" "$W/megatron-verify.log" | grep -v Warning | head -5; tail -6 "$W/megatron-verify.log"
      if [ -n "$deadline_s" ]; then
        left=$(( deadline_s - SECONDS - 10 )); [ $left -lt $blim ] && blim=$left
      fi
      # shellcheck disable=SC2086  # --mg-bench-args: words on purpose
      x timeout "$blim" python3 -m benchmarks.megatron_bench --out "$W" --model "$mg_model" $mg_bench_args \
        --deadline-s $(( blim - 20 )) >"$W/megatron-bench.log" 2>&1 || rc=1
      grep -E "Error|Traceback" "$W/megatron-bench.log" | grep -v Warning | head -5
      x python3 -m benchmarks.megatron_bench --summary "$W";;
    search)
      budget=$search_budget_s
      if [ -n "$deadline_s" ]; then  # leave --search-reserve-s (default 90) after the search for later steps
        left=$(( deadline_s - SECONDS - 40 - search_reserve_s )); [ $left -lt $budget ] && budget=$left
      fi
      echo "search budget ${budget} s"
      OUT=$W x bash benchmarks/gpu_search.sh "$search_name" "$budget" >"$W/search.log" 2>&1 || rc=1
      tail -20 "$W/search.log";;
    *) echo "unknown step $step"; rc=2;;
  esac
  echo "   ($step: $(( $(date +%s) - t0 )) s)"
done
[ $dry = 1 ] && { rm -rf "$W"; exit $rc; }
# at most 8 files come back: one bundle with everything + the small JSON results beside it
(cd "$W" && tar czf "$OUT/bundle.tgz" .)
find "$W" -maxdepth 1 -name "*.json" -size -4M | head -6 | xargs -r cp -t "$OUT"
rm -rf "$W"
ls -la "$OUT"
exit $rc

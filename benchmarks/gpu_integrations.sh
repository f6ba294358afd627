#!/usr/bin/env bash
# GPU calls for the integration issues (SGLang proof, Liger baseline, AReaL recompute saving, verify grid,
# layer bench, knob search). Needs the carried wheels:
#   python -m devenv.sglang_wheels .whl       # SGLang 0.5.23 (trimmed) + deps
#   python -m devenv.areal_gpu_wheels .whl-areal   # areal 1.0.4 + light deps, liger-kernel
# Usage (device call, carry [".whl", ".whl-areal"]):
#   bash benchmarks/gpu_integrations.sh STEP [STEP...]
# STEPs: sglang | sglang-ab | sglang-profile | liger | recompute | verify-full | layer-bench | gemm-sweep | ops-quick | host | search | gsm8k | gsm8k-e2e | areal-bits
# (ops-quick: contract checks + --quick benchmark grid of TIK_OPS (comma list), a probe, not the evidence call)
# (search: TIK_DEADLINE_S caps its budget so that TIK_SEARCH_RESERVE_S seconds remain for later steps)
# (gsm8k: kind nvidia-h200-x2, wheels built with `devenv.areal_gpu_wheels .whl-areal --trainer`;
#  about 150-200 s per mode, TIK_GSM8K_LIMIT=240 s each)
# Everything lands in $OUT/bundle.tgz (plus the step JSONs next to it); a short table per step on stdout.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tik-out}
mkdir -p "$OUT/w"
W=$OUT/w
for d in .whl .whl-areal .whl-fi; do
  if ls $d/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $d/*.whl \
      >>"$W/pip.log" 2>&1 || { tail -20 "$W/pip.log"; exit 1; }
  fi
done
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$W/pip.log" 2>&1 || { tail -20 "$W/pip.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
STUBS=$PWD/devenv/areal_gpu_stubs:$PWD/devenv/areal_cpu_stubs
rc=0
for step in "$@"; do
  t0=$(date +%s)
  echo "== $step"
  # the AReaL steps import orjson, pydantic, ... from the SGLang set (.whl) as well as AReaL's own (.whl-areal)
  case $step in
    recompute|areal-bits|gsm8k|gsm8k-e2e)
      for d in .whl .whl-areal; do
        ls $d/*.whl >/dev/null 2>&1 || { echo "$step: no wheels in $d (carry both .whl and .whl-areal)"; rc=1; continue 2; }
      done;;
  esac
  case $step in
    sglang)
      # TIK_SGL_TINY=1: a tiny eager run first (a failure shows in ~1 min); then the qwen3-4b-shaped proof
      # (TIK_SGL_BASELINES: stock backends timed on the same jobs, default flashinfer with FlashInfer-served
      # fused ops -- carry .whl-fi too, built with `devenv.flashinfer_wheel .whl-fi --no-deps` so that .whl, .whl-fi
      # and the tree stay under 64 MiB (apache-tvm-ffi comes with .whl); TIK_SGL_REPEAT: greedy jobs, median of the last - 1; TIK_SGL_EAGER=1: no CUDA graphs;
      # TIK_SGL_SHAPE=qwen3-30b-a3b: the Qwen3-MoE model path, TIK_SGL_MOE_LAYERS layers, default 4)
      r=0
      if [ "${TIK_SGL_TINY:-1}" = 1 ]; then
        timeout 170 python3 -m benchmarks.sglang_gpu_proof --out "$W/tiny" --stub-sgl-kernel \
          --shape tiny --batch 8 --new 32 --baselines "" --timeout 150 --engine-arg disable_cuda_graph=true >"$W/sglang-tiny.log" 2>&1
        r=$?; tail -4 "$W/sglang-tiny.log"
      fi
      if [ $r -eq 0 ] || [ $r -eq 3 ]; then
        eager=; [ "${TIK_SGL_EAGER:-0}" = 1 ] && eager="--engine-arg disable_cuda_graph=true"
        timeout "${TIK_SGL_LIMIT:-390}" python3 -m benchmarks.sglang_gpu_proof --out "$W" --stub-sgl-kernel \
          --shape "${TIK_SGL_SHAPE:-qwen3-4b}" --batch "${TIK_SGL_BATCH:-32}" --new "${TIK_SGL_NEW:-128}" --baselines "${TIK_SGL_BASELINES-flashinfer}" \
          --repeat "${TIK_SGL_REPEAT:-6}" --timeout $(( ${TIK_SGL_LIMIT:-390} - 20 )) $eager >"$W/sglang.log" 2>&1 || rc=1
        grep -E "Error|error:|Traceback" "$W/sglang.log" | head -8; tail -6 "$W/sglang.log"
      else
        rc=1; grep -E "Error|error:|Traceback|stub" "$W/sglang-tiny.log" | tail -12
      fi;;
    sglang-ab)
      # the short launch path A/B in one call (same host): the tik-only proof with TIK_FAST_LAUNCH=1, then =0
      for fl in 1 0; do
        TIK_FAST_LAUNCH=$fl timeout "${TIK_SGL_LIMIT:-200}" python3 -m benchmarks.sglang_gpu_proof \
          --out "$W/fast$fl" --stub-sgl-kernel --shape "${TIK_SGL_SHAPE:-qwen3-4b}" --batch "${TIK_SGL_BATCH:-32}" \
          --new "${TIK_SGL_NEW:-128}" --baselines "" --repeat "${TIK_SGL_REPEAT:-3}" \
          --timeout $(( ${TIK_SGL_LIMIT:-200} - 20 )) >"$W/sglang-fast$fl.log" 2>&1 || rc=1
        echo "-- TIK_FAST_LAUNCH=$fl"; grep -E "^tik|bitwise|Error|Traceback" "$W/sglang-fast$fl.log" | head -5
      done;;
    sglang-profile)
      # where the host time of SGLang's tik decode goes: py-spy (carry its wheel in .whl) samples every process
      # of the tik-only proof with TIK_SGL_REPEAT (default 6) greedy jobs (not under `timeout`: py-spy attaches
      # to the Python process; a watchdog ends it after TIK_SGL_LIMIT s); raw stacks + benchmarks/probes/pyspy_summary.py
      lim=${TIK_SGL_LIMIT:-200}
      python3 -m benchmarks.sglang_gpu_proof --out "$W/prof" --stub-sgl-kernel \
        --shape "${TIK_SGL_SHAPE:-qwen3-4b}" --batch "${TIK_SGL_BATCH:-32}" --new "${TIK_SGL_NEW:-128}" --baselines "" \
        --repeat "${TIK_SGL_REPEAT:-6}" --timeout $(( lim - 20 )) >"$W/sglang-profile.log" 2>&1 &
      pid=$!
      ( sleep "$lim"; kill "$pid" 2>/dev/null ) & dog=$!
      PATH=/tmp/site/bin:$PATH py-spy record --subprocesses --nonblocking --rate "${TIK_PYSPY_RATE:-100}" --format raw \
        -o "$W/pyspy-raw.txt" --pid "$pid" >"$W/pyspy.log" 2>&1 &
      spy=$!
      wait "$pid" || rc=1
      kill "$dog" 2>/dev/null; wait "$spy"
      grep -E "^tik|bitwise|Error|Traceback" "$W/sglang-profile.log" | head -5; tail -2 "$W/pyspy.log"
      python3 benchmarks/probes/pyspy_summary.py "$W/pyspy-raw.txt" --top 30 --json "$W/pyspy-summary.json" >"$W/pyspy-summary.txt" \
        && head -80 "$W/pyspy-summary.txt" | cut -c1-150;;
    liger)
      python3 -m areal_tik_plugin.contract --out "$W" --ops rmsnorm,rope,swiglu --quick >"$W/liger.log" 2>&1 || rc=1
      grep -E "^(FAIL|ERROR)|liger" "$W/liger.log" | head -12; tail -5 "$W/liger.log";;
    recompute)
      for mode in baseline tik; do
        flag=; [ $mode = tik ] && flag=--tik
        PYTHONPATH=$PYTHONPATH:$STUBS timeout "${TIK_RC_LIMIT:-280}" torchrun --nproc-per-node 1 recipes/bench_recompute.py $flag \
          --batch "${TIK_RC_BATCH:-64}" --steps "${TIK_RC_STEPS:-3}" --out "$W/recompute-$mode.json" \
          >"$W/recompute-$mode.log" 2>&1 || rc=1
        echo "-- $mode"; grep -E "Error|Traceback" "$W/recompute-$mode.log" | head -5
        grep -E '"(recompute_s|update_s|step_with_recompute_s|step_without_recompute_s|saving_fraction)"' "$W/recompute-$mode.log"
      done;;
    verify-full)
      # plugin path only by default: the stock comparison (HF cached decode) at batch 64 x 1K responses did
      # not finish in 180 s per model; TIK_VERIFY_FLAGS="" TIK_VERIFY_BATCH=8 runs it
      lim=(${TIK_VERIFY_LIMITS:-150 150 90})  # seconds per model, in this order (TIK_VERIFY_MODELS: ';'-list)
      i=0
      IFS=';' read -ra models <<< "${TIK_VERIFY_MODELS:-qwen2.5-1.5b;qwen3-4b;qwen3-30b-a3b --layers 4}"
      for m in "${models[@]}"; do
        set -- $m
        timeout "${lim[$i]}" python3 -m areal_tik_plugin.verify --model $m --prompt-len 1024 --response-len 128..1024 \
          --batch "${TIK_VERIFY_BATCH:-64}" ${TIK_VERIFY_FLAGS---no-stock} --out "$W/verify-$1.json" >"$W/verify-$1.log" 2>&1 || rc=1
        tail -3 "$W/verify-$1.log"; i=$((i + 1))
      done;;
    layer-bench)
      timeout "${TIK_LB_LIMIT:-500}" python3 -m benchmarks.layer_bench --out "$W" ${TIK_LB_ARGS:---quick} >"$W/layer_bench.log" 2>&1 || rc=1
      tail -20 "$W/layer_bench.log";;
    gemm-sweep)
      timeout "${TIK_GS_LIMIT:-300}" python3 -m benchmarks.gemm_sweep --out "$W" ${TIK_GS_ARGS:-} >"$W/gemm_sweep.log" 2>&1 || rc=1
      grep -vE "^\s*$" "$W/gemm_sweep.log" | tail -66 | cut -c1-150;;
    ops-quick)
      timeout "${TIK_OPS_LIMIT:-240}" python3 -m areal_tik_plugin.contract --out "$W" --ops "${TIK_OPS:-rope,attention}" --quick \
        >"$W/ops-quick.log" 2>&1 || rc=1
      grep -E "^(FAIL|ERROR)" "$W/ops-quick.log" | cut -c1-300 | head -10; tail -12 "$W/ops-quick.log";;
    host)
      timeout "${TIK_HOST_LIMIT:-120}" python3 -m benchmarks.host_overhead --out "$W" >"$W/host.log" 2>&1 || rc=1
      head -12 "$W/host.log"; grep -A30 "ncalls" "$W/host.log" | cut -c1-150;;
    gsm8k-e2e)
      # the end-to-end cell (recipes/gsm8k/model/gpu-e2e-qwen3.yaml; kind nvidia-h200-x2, carry .whl, .whl-areal
      # built with --trainer, .whl-fi): NCCL weight updates, AReaL's default FSDP attention (flash_attention_2;
      # sdpa, said here, when flash_attn is not importable), 1 warm-up + 20 measured steps, baseline = stock SGLang
      # on FlashInfer attention with FlashInfer-served fused ops when FlashInfer is carried. Both modes in this
      # one step (TIK_GSM8K_MODES="baseline" / "tik" runs one per device call if both do not fit in 10 min).
      export TIK_GSM8K_MODEL_GROUP=${TIK_GSM8K_MODEL_GROUP:-gpu-e2e-qwen3} TIK_GSM8K_LIMIT=${TIK_GSM8K_LIMIT:-540}
      if ! python3 -c "import flash_attn" 2>/dev/null; then
        export TIK_E2E_ATTN_IMPL=${TIK_E2E_ATTN_IMPL:-sdpa}
        echo "flash_attn not importable: FSDP attn_impl=$TIK_E2E_ATTN_IMPL (AReaL's default flash_attention_2 needs it)"
      fi
      ;&
    gsm8k)
      # the GSM8K GRPO recipe, staleness 0, baseline (AReaL recompute, stock SGLang: Triton attention +
      # torch-native ops, no sgl-kernel) then tik, on a random full-size Qwen3 (recipes/gsm8k/model/
      # gpu-random-qwen3.yaml: SGLang on GPU 0, FSDP on GPU 1, disk weight updates, 4 steps of 8x8 samples
      # x 512 tokens, step 0 = warm-up). Parity reward (a random model scores 0 on GSM8K). Per mode: one
      # summary line (tok/s, step time, phases); $W/gsm8k-summary.json + `tik compare` report in the bundle.
      # CPU rehearsal: TIK_GSM8K_MODEL_GROUP=cpu-tiny TIK_GSM8K_BUILD= TIK_TINY_MODEL=$TIK_GPU_MODEL
      export TIK_GPU_MODEL=${TIK_GPU_MODEL:-/tmp/tik-random-qwen3-1.7b}
      if [ ! -f "$TIK_GPU_MODEL/config.json" ]; then
        timeout 200 python3 -m areal_tik_plugin.models $TIK_GPU_MODEL qwen3 \
          ${TIK_GSM8K_BUILD---shape qwen3-1.7b --device cuda} >"$W/gsm8k-build.log" 2>&1 || { rc=1; tail -5 "$W/gsm8k-build.log"; }
      fi
      runs=
      for mode in ${TIK_GSM8K_MODES:-baseline tik}; do
        [ -f "$TIK_GPU_MODEL/config.json" ] || break
        d=$W/gsm8k-$mode; mkdir -p "$d"; rm -rf /tmp/gsm8k-$mode
        PYTHONPATH=$PWD/devenv/gpu_stubs:$PYTHONPATH:$STUBS SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 \
          SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python WANDB_MODE=offline HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
          TRANSFORMERS_OFFLINE=1 TIK_GSM8K_DATA=$PWD/tests/data/gsm8k_tiny \
          TIK_REWARD_FN=areal_tik_plugin.integrations.areal.testing.parity_reward_fn \
          timeout -k 60 "${TIK_GSM8K_LIMIT:-240}" python3 -m areal_tik_plugin.run --spmd --log-dir "$d" recipes/gsm8k_rl.py \
          --config recipes/gsm8k/config.yaml model=${TIK_GSM8K_MODEL_GROUP:-gpu-random-qwen3} algorithm=grpo staleness=s0 \
          mode=$mode cluster.fileroot=/tmp/gsm8k-$mode/fr cluster.name_resolve.nfs_record_root=/tmp/gsm8k-$mode/nr \
          trial_name=gpu-$mode tik.stats_jsonl=$d/tik_stats.jsonl ${TIK_GSM8K_ARGS:-} >"$W/gsm8k-$mode.log" 2>&1
        r=$?; [ $r -eq 0 ] || rc=1
        echo "-- $mode (exit $r, $(( $(date +%s) - t0 )) s into the step)"
        grep -E "\[tik\] (GPUs|SGLang|plugin)" "$W/gsm8k-$mode.log" | grep -v "dropped arguments" | head -4
        if [ $r -ne 0 ]; then  # the trainer's first errors, then the server's
          grep -E "Error|Traceback" "$W/gsm8k-$mode.log" | head -6
          grep -hE "Error|error:|Traceback|stub" "$d"/sglang_*.log 2>/dev/null | grep -v "Connection refused\|freeze_gc" | head -6
        fi
        python3 -m areal_tik_plugin.integrations.areal.summary "$d/tik_stats.jsonl" || rc=1
        runs="$runs $d/tik_stats.jsonl"
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | head -4  # leftovers
        rm -rf /tmp/gsm8k-$mode  # weight-update checkpoints, rollout dumps
      done
      if [ -n "$runs" ]; then
        echo "-- summary (steps after the warm-up)"
        python3 -m areal_tik_plugin.integrations.areal.summary $runs --json "$W/gsm8k-summary.json" || rc=1
        python3 -m areal_tik_plugin.cli compare $runs -o "$W/gsm8k-compare" >/dev/null 2>&1 || echo "(tik compare failed)"
      fi;;
    areal-bits)
      # where rollout and training part when the GSM8K GPU run's monitor sees differing tokens
      # at step 0: A = SGLang Engine (tik) vs the plain plugin-patched HF packed forward on that
      # run's model and SGLang settings (no chunked prefill, no radix cache, context 1024, 64 running);
      # B = AReaL's FSDP actor compute_logp vs the same HF forward (no SGLang)
      export TIK_GPU_MODEL=${TIK_GPU_MODEL:-/tmp/tik-random-qwen3-1.7b}
      [ -f "$TIK_GPU_MODEL/config.json" ] || timeout 200 python3 -m areal_tik_plugin.models \
        $TIK_GPU_MODEL qwen3 --shape qwen3-1.7b --device cuda >"$W/bits-build.log" 2>&1 || { rc=1; tail -3 "$W/bits-build.log"; }
      if [ "${TIK_BITS_SGLANG:-1}" = 1 ]; then  # TIK_BITS_SGLANG=0: part B only
        timeout 220 python3 -m benchmarks.sglang_gpu_proof --out "$W/bits-sglang" --stub-sgl-kernel \
          --model-dir $TIK_GPU_MODEL --batch 64 --prefix 300 --new 128 --baselines "" --timeout 200 \
          --engine-arg chunked_prefill_size=-1 --engine-arg disable_radix_cache=true --engine-arg context_length=1024 \
          >"$W/bits-sglang.log" 2>&1 || rc=1
        echo "-- A: SGLang (tik) vs plain patched HF"; grep -E "Error|Traceback" "$W/bits-sglang.log" | head -3; tail -2 "$W/bits-sglang.log"
      fi
      PYTHONPATH=$PYTHONPATH:$STUBS timeout 200 torchrun --nproc-per-node 1 recipes/bench_recompute.py --tik \
        --model-dir $TIK_GPU_MODEL --check-bits 16 --batch 16 --prompt 36 --response 512 --steps 1 --warmup 0 \
        --out "$W/bits-areal.json" >"$W/bits-areal.log" 2>&1 || rc=1
      echo "-- B: AReaL FSDP actor vs plain patched HF"; grep -E "check_bits|Error|Traceback" "$W/bits-areal.log" | cut -c1-1500 | head -5;;
    search)
      budget=${TIK_SEARCH_BUDGET_S:-300}
      if [ -n "$TIK_DEADLINE_S" ]; then  # leave TIK_SEARCH_RESERVE_S (default 90) after the search for later steps
        left=$(( TIK_DEADLINE_S - SECONDS - 40 - ${TIK_SEARCH_RESERVE_S:-90} )); [ $left -lt $budget ] && budget=$left
      fi
      echo "search budget ${budget} s"
      OUT=$W bash benchmarks/gpu_search.sh "${TIK_SEARCH_NAME:-h200-knobs}" "$budget" >"$W/search.log" 2>&1 || rc=1
      tail -20 "$W/search.log";;
    *) echo "unknown step $step"; rc=2;;
  esac
  echo "   ($step: $(( $(date +%s) - t0 )) s)"
done
# at most 8 files come back: one bundle with everything + the small JSON results beside it
(cd "$W" && tar czf "$OUT/bundle.tgz" .)
find "$W" -maxdepth 1 -name "*.json" -size -4M | head -6 | xargs -r cp -t "$OUT"
rm -rf "$W"
ls -la "$OUT"
exit $rc

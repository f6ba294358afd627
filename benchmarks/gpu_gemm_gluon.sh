#!/usr/bin/env bash
# One GPU call (nvidia-h200, <= 550 s): an implementation's Gluon GEMM (gemm_gluon.py, default tik_v7) on the
# device, evidence JSON under $OUT packed into $OUT/00-gemm-gluon.tgz, a short table last. Nothing carried.
#   1. benchmarks/probes/gluon_gemm_probe.py: bits against the parent's Triton GEMM (--ref) at M 64..1024 on
#      every dense shape (every plan at M 64, 128 and 256, 64-row tiles too at 128); times against the parent
#      and cuBLAS (<= 300 s; 145 s with plans at M 64 / 256 only, on an H100). Its guard
#      first runs every plan on three small problems in a child process (<= 120 s): a hang or crash there ends
#      the probe (exit 3) and the contract step is skipped, so the call still returns what it learned;
#   2. with --contract-s S > 0 only: the contract suite's gemm checks on the implementation (every configuration
#      incl. the Gluon ones; tik_v6's took 196 s on the H200, tik_v7's wrote nothing within 260 s on an H100:
#      run it alone when a candidate is to be exported);
#   3. benchmarks/probes/tma_host_probe.py --only attention on --host-impl (default tik_v6): host time per
#      prefill call and the native launcher's counters (<= 60 s).
# Options (an unknown one is refused): --impl NAME (tik_v7)  --ref NAME (tik_v6)  --host-impl NAME (tik_v6)
#   --probe-s S (300)  --contract-s S (0: skipped)  --host-s S (60)  --guard-s S (120)  --dry-run (print the command lines only)
set -o pipefail
export PYTHONUNBUFFERED=1
impl=tik_v7; ref=tik_v6; host_impl=tik_v6; probe_s=300; contract_s=0; host_s=60; guard_s=120; dry=0
need() { [ $# -ge 2 ] || { echo "gpu_gemm_gluon.sh: $1 needs a value (see the header of benchmarks/gpu_gemm_gluon.sh)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --impl) need "$@"; impl=$2; shift 2;;
    --ref) need "$@"; ref=$2; shift 2;;
    --host-impl) need "$@"; host_impl=$2; shift 2;;
    --probe-s) need "$@"; probe_s=$2; shift 2;;
    --contract-s) need "$@"; contract_s=$2; shift 2;;
    --host-s) need "$@"; host_s=$2; shift 2;;
    --guard-s) need "$@"; guard_s=$2; shift 2;;
    --dry-run) dry=1; shift;;
    *) echo "gpu_gemm_gluon.sh: unknown option $1 (expected --impl, --ref, --host-impl, --probe-s, --contract-s, --host-s, --guard-s, --dry-run)" >&2; exit 2;;
  esac
done
for v in "$probe_s" "$contract_s" "$host_s" "$guard_s"; do
  case "$v" in ''|*[!0-9]*) echo "gpu_gemm_gluon.sh: a time limit must be whole seconds, got '$v'" >&2; exit 2;; esac
done
OUT=${OUT:-/tmp/tik-out}
run() {  # run LABEL SECONDS CMD...: one step under its time limit, its output in $OUT/LABEL.log
  local label=$1 secs=$2; shift 2
  if [ "$dry" = 1 ]; then printf '+ timeout %s' "$secs"; printf ' %q' "$@"; echo; return 0; fi
  timeout "$secs" "$@" >"$OUT/$label.log" 2>&1; local rc=$?
  echo "$label rc=$rc" >>"$OUT/steps.txt"
  [ "$rc" = 124 ] && echo "$label: cut at $secs s" >>"$OUT/steps.txt"
  return 0
}
mkdir -p "$OUT"
if [ "$dry" = 0 ]; then
  : >"$OUT/steps.txt"
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/device.txt"
fi
run probe "$probe_s" env TIK_IMPLEMENTATION="$impl" python3 -m benchmarks.probes.gluon_gemm_probe --out "$OUT" --ref "$ref" \
  --guard-s "$guard_s"
if [ "$contract_s" = 0 ]; then
  [ "$dry" = 0 ] && echo "contract: skipped (--contract-s 0)" >>"$OUT/steps.txt"
elif [ "$dry" = 0 ] && grep -q "^probe rc=3" "$OUT/steps.txt"; then
  echo "contract: skipped (the probe's guard run failed: see probe.log)" >>"$OUT/steps.txt"
else
  run contract "$contract_s" env TIK_IMPLEMENTATION="$impl" python3 -m areal_tik_plugin.contract --out "$OUT" --ops gemm --no-bench
fi
run host "$host_s" env TIK_IMPLEMENTATION="$host_impl" python3 -m benchmarks.probes.tma_host_probe --only attention --out "$OUT"
[ "$dry" = 1 ] && exit 0
(cd "$OUT" && tar czf 00-gemm-gluon.tgz --exclude=00-gemm-gluon.tgz ./*.json ./*.log ./*.txt 2>/dev/null)
cat "$OUT/steps.txt"
tail -n 12 "$OUT/probe.log"
grep -E "passed|failed|checks" "$OUT/contract.log" | tail -n 4
tail -n 4 "$OUT/host.log"

#!/usr/bin/env bash
# One device call: the prefill tile-loop probes on the H200 (writes under $OUT, prints a table last).
#   1. benchmarks/probes/wgmma_overlap_probe.py: the contract's unmasked tile loop as Triton writes it
#      against explicit-wgmma (Gluon) forms that issue the next score MMA ahead; bits vs Triton's loop.
#   2. benchmarks/probes/gluon_prefill_probe.py: kernels/$GLUON_IMPL's prefill (Gluon on sm_90; default tik_v4)
#      vs tik_v2's: bits, time (gluon_prefill_probe[-IMPL].json).
#   3. Nsight Compute of the selected prefill (attention_varlen) against cuDNN SDPA on the same shapes:
#      details page and per-SASS-line stall samples of our kernel.
#   bash benchmarks/gpu_prefill_probes.sh [CASES]     (CASES: ncu_probe.py --cases, prefill:B:L,...)
#   STEPS="wgmma gluon ncu" (default: all three); GLUON_IMPL, GLUON_CONFIGS, GLUON_GUARD_S: gluon_prefill_probe.py
#   --impl, --configs, --guard-s (each knob set first alone in a child process with that limit: a hang drops it).
#   Everything is also packed into $OUT/prefill_probes.tgz (the device returns a limited number of files).
set -uo pipefail  # each step reports its own failure; a hung kernel is cut by its timeout
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the output folder}
CASES=${1:-prefill:4:8192,prefill:16:1024}
IMPL=${TIK_IMPLEMENTATION:-tik_v2}
export TIK_IMPLEMENTATION=$IMPL
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv >"$OUT/gpu.txt" 2>&1 || true

STEPS=" ${STEPS:-wgmma gluon ncu} "
GLUON_IMPL=${GLUON_IMPL:-tik_v4}
gname=gluon_prefill_probe$([ "$GLUON_IMPL" = tik_v4 ] || echo "-$GLUON_IMPL")
[[ $STEPS == *" wgmma "* ]] && echo "== wgmma overlap probe (2 and 3 stages)"
for st in 2 3; do
  [[ $STEPS == *" wgmma "* ]] || break
  timeout 180 python3 benchmarks/probes/wgmma_overlap_probe.py --stages "$st" --json "$OUT/wgmma_overlap_probe-s$st.json" \
    >"$OUT/wgmma_overlap_probe-s$st.log" 2>&1 || echo "wgmma probe (stages $st) failed: $(tail -3 "$OUT/wgmma_overlap_probe-s$st.log")"
done

if [[ $STEPS == *" gluon "* ]]; then
  echo "== gluon prefill probe ($GLUON_IMPL vs tik_v2 bits and time, cuDNN beside; configs: ${GLUON_CONFIGS:-defaults})"
  timeout "${PROBE_TIMEOUT:-400}" python3 benchmarks/probes/gluon_prefill_probe.py --impl "$GLUON_IMPL" --configs "${GLUON_CONFIGS:-}" \
    --guard-s "${GLUON_GUARD_S:-0}" --json "$OUT/$gname.json" >"$OUT/$gname.log" 2>&1 \
    || echo "gluon prefill probe failed: $(tail -5 "$OUT/$gname.log")"
fi

name=ncu_prefill-$IMPL
if [[ $STEPS != *" ncu "* ]]; then
  :
elif command -v ncu >/dev/null; then
  echo "== ncu prefill ($CASES, $IMPL)"
  ncu --clock-control none --profile-from-start off --set full --import-source yes -o "$OUT/$name" \
    python3 benchmarks/probes/ncu_probe.py --cases "$CASES" >"$OUT/$name.run.log" 2>&1 || echo "ncu failed: $(tail -3 "$OUT/$name.run.log")"
  if [ -f "$OUT/$name.ncu-rep" ]; then
    ncu --import "$OUT/$name.ncu-rep" --page details >"$OUT/$name.txt" 2>&1 || true
    ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass -k regex:_attn_fwd \
      2>/dev/null | gzip -9 >"$OUT/$name-sass.csv.gz" || true
    rm -f "$OUT/$name.ncu-rep"
  fi
else
  echo "ncu not found" | tee "$OUT/$name.run.log"
fi

(cd "$OUT" && tar czf prefill_probes.tgz --exclude prefill_probes.tgz ./*)
echo "== summary"
python3 - "$OUT" "$name" "$gname" <<'EOF'
import glob, json, os, re, sys
out, name, gname = sys.argv[1], sys.argv[2], sys.argv[3]
for f in sorted(glob.glob(os.path.join(out, "wgmma_overlap_probe-s*.json"))):
    r = json.load(open(f))
    print(f"{os.path.basename(f)}: rows {r['rows']} keys {r['keys']} stages {r['stages']}")
    for k, v in r["kernels"].items():
        if isinstance(v, dict):
            c = r["compile_sm90"].get(k, {})
            print(f"  {k:15s} {v['us']:9.2f} us {v['tflops']:7.1f} TFLOP/s  bits==triton {v['bits_equal_out']},"
                  f"{v['bits_equal_lse']}  regs {c.get('regs')} spill {c.get('spill_bytes')}")
    print(f"  fp64 max abs err (triton loop): {r['kernels']['fp64_max_abs_err_triton']:.2e}")
g = os.path.join(out, gname + ".log")
if os.path.exists(g):
    lines = open(g).read().splitlines()
    i = next((j for j, l in enumerate(lines) if l.startswith("bits vs tik_v2")), None)
    print("\n".join(lines[i:] if i is not None else lines[-8:]))
t = os.path.join(out, name + ".txt")
if os.path.exists(t):
    kern, dur = None, []
    for line in open(t):
        m = re.match(r"\s{2}(\S+) \(([^)]*)\)x\(([^)]*)\)", line)
        if m:
            kern = (m.group(1)[:40], m.group(2), m.group(3))
        m = re.match(r"\s+Duration\s+(\S+)\s+([\d.,]+)", line)
        if m and kern:
            dur.append((kern, m.group(1), m.group(2)))
            kern = None
    for (k, g, b), unit, v in dur:
        print(f"  ncu {k:40s} grid ({g}) block ({b}) {v} {unit}")
EOF

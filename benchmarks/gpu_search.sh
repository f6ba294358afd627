#!/usr/bin/env bash
# One GPU call: install the project (offline, no deps), run the knob search on one spec (default: H200
# attention), leave the run directory under $OUT (and all of it in $OUT/NAME.tgz: commit the unpacked tree
# under evidence/search/). Resumes when $OUT/$NAME already holds a run (or RESUME_FROM names one).
#   bash benchmarks/gpu_search.sh [NAME] [TIME_BUDGET_S] [extra `tik search run` args, e.g. --max-steps 12]
# SPEC: the evaluation spec (default search/specs/h200_attention.yaml); the batch-invariant GEMM:
#   SPEC=search/specs/h200_gemm.yaml bash benchmarks/gpu_search.sh h200-gemm-knobs 420
# IMPL: the root implementation of a new run, a name under kernels/ or a folder (default: the `root` a --plan
# file names, else tik_v1; an IMPL other than the plan's root is refused), e.g.
#   IMPL=tik_v2 bash benchmarks/gpu_search.sh h200-attn-agent2 480 --driver plan --plan PLAN.yaml
# The spec's root latencies are measured on this GPU at initialization (audit E0000). QUICK=0: the spec's full
# workloads and suites instead of `--quick`.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/tik-out}
# NAME and TIME_BUDGET_S come first; the arguments after them go to `tik search run`, which refuses unknown ones
case "${1:-}" in -*) echo "gpu_search.sh: unknown option $1: NAME and TIME_BUDGET_S come first (see the header of benchmarks/gpu_search.sh)" >&2; exit 2;; esac
NAME=${1:-h200-knobs}
SPEC=${SPEC:-search/specs/h200_attention.yaml}
PLAN=""; prev=""
for a in "$@"; do
  case "$a" in --plan=*) PLAN=${a#--plan=};; *) [ "$prev" = "--plan" ] && PLAN=$a;; esac
  prev=$a
done
PLAN_ROOT=""
if [ -n "$PLAN" ] && [ -f "$PLAN" ]; then
  PLAN_ROOT=$(python3 -c 'import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); print(d.get("root") or "" if isinstance(d, dict) else "")' "$PLAN") \
    || { echo "gpu_search.sh: cannot read the plan $PLAN (see the header of benchmarks/gpu_search.sh)" >&2; exit 2; }
fi
if [ -n "$PLAN_ROOT" ] && [ -n "$IMPL" ] && [ "$IMPL" != "$PLAN_ROOT" ]; then
  echo "gpu_search.sh: IMPL=$IMPL, but the plan $PLAN is written for the root $PLAN_ROOT (see the header of benchmarks/gpu_search.sh)" >&2; exit 2
fi
IMPL=${IMPL:-${PLAN_ROOT:-tik_v1}}
BUDGET=${2:-420}
[[ $BUDGET =~ ^-?[0-9]+$ ]] || { echo "gpu_search.sh: TIME_BUDGET_S: expected seconds, got $BUDGET (see the header of benchmarks/gpu_search.sh)" >&2; exit 2; }
[ -d "kernels/$IMPL" ] || [ -d "$IMPL" ] || { echo "gpu_search.sh: IMPL: expected a name under kernels/ or a folder, got $IMPL (see the header of benchmarks/gpu_search.sh)" >&2; exit 2; }
shift 2 2>/dev/null || shift $#
# QUICK=0: the spec's full workload set and bitwise suites (e.g. h200_gemm's M = 4096 rows); default: --quick
case "${QUICK:-1}" in 0) quick=();; 1) quick=(--quick);; *) echo "gpu_search.sh: QUICK: expected 0 or 1, got $QUICK" >&2; exit 2;; esac
mkdir -p "$OUT"
# resume a run brought back from an earlier call: RESUME_FROM=path/to/run (copied to $OUT/$NAME, made writable)
if [ -n "$RESUME_FROM" ] && [ ! -e "$OUT/$NAME" ]; then
  cp -r "$RESUME_FROM" "$OUT/$NAME" && chmod -R u+w "$OUT/$NAME" && rm -f "$OUT/$NAME/.lock"
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
echo "spec: $SPEC  root: $IMPL"
python3 -m areal_tik_plugin.cli search run --driver knobs --spec "$SPEC" --impl "$IMPL" \
  --run-dir "$OUT/$NAME" --time-budget-s "$BUDGET" "${quick[@]}" "$@" 2>&1 | tee -a "$OUT/$NAME.log"
rc=${PIPESTATUS[0]}
python3 -m areal_tik_plugin.cli search status "$OUT/$NAME" | tee -a "$OUT/$NAME.log"
python3 -m areal_tik_plugin.cli search report "$OUT/$NAME" 2>/dev/null || echo "(report: run 'tik search report' where matplotlib is installed)"
# the device returns at most 8 files, 2 folders deep: the whole run directory (records/, impls/) as one tarball
tar czf "$OUT/$NAME.tgz" -C "$OUT" "$NAME" && echo "run directory: $OUT/$NAME.tgz"
exit $rc

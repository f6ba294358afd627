#!/usr/bin/env bash
# compile_sm90.json: the sm_90 compile facts (registers, spills, shared memory, load path per kernel) of the
# root and of every distinct tree a step of plan.yaml can build (its lineage of edit files), no GPU needed.
#   bash benchmarks/search_plans/h200_attention/compile_plan.sh [PYTHON]
set -e
PY=${1:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../../.."
J=$HERE/compile_sm90.json
rm -f "$J"
"$PY" benchmarks/compile_attention_sm90.py --impl kernels/tik_v1 --json "$J" --label root || true
"$PY" - "$HERE" <<'PYEOF' | sort -u | while read -r label; do
import os, sys, yaml
sys.path.insert(0, sys.argv[1])
from materialize import lineage
plan = yaml.safe_load(open(os.path.join(sys.argv[1], "plan.yaml")))
for s in plan["steps"]:
    print("+".join(os.path.basename(e).replace(".edits", "") for e in lineage(plan, s["opportunity"])))
# the 3-stage edit, kept for the next plan
print("tma_kv+stages3")
print("tma_kv+fma_shift+lpt_grid+bm128_w8+stages3")
PYEOF
  tmp=$(mktemp -d)
  args=()
  IFS=+ read -ra parts <<<"$label"
  for p in "${parts[@]}"; do args+=("$HERE/edits/$p.edits"); done
  "$PY" "$HERE/materialize.py" "$tmp/impl" "${args[@]}" >/dev/null
  echo "== $label"
  "$PY" benchmarks/compile_attention_sm90.py --impl "$tmp/impl" --json "$J" --label "$label" | grep -E "^(ok|FAIL)|failure" || true
  rm -rf "$tmp"
done

#!/usr/bin/env bash
# compile_sm90.json: sm_90 compile facts (registers, spills, shared memory, load path per kernel) of the root
# kernels/tik_v2 and of every distinct tree a step of plan.yaml can build (its lineage of edit files), no GPU.
#   bash benchmarks/search_plans/h200_attention/next/compile_plan.sh [PYTHON]
set -e
PY=${1:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../../../.."
export TIK_PLAN_ROOT=kernels/tik_v2
J=$HERE/compile_sm90.json
rm -f "$J"
"$PY" benchmarks/compile_attention_sm90.py --impl kernels/tik_v2 --json "$J" --label root || true
"$PY" - "$HERE" <<'PYEOF' | sort -u | while read -r label; do
import os, sys, yaml
sys.path.insert(0, os.path.dirname(sys.argv[1]))
from materialize import lineage
plan = yaml.safe_load(open(os.path.join(sys.argv[1], "plan.yaml")))
for s in plan["steps"]:
    print("+".join(lineage(plan, s["opportunity"])))
PYEOF
  tmp=$(mktemp -d)
  args=()
  IFS=+ read -ra parts <<<"$label"
  for p in "${parts[@]}"; do args+=("$HERE/$p"); done
  "$PY" "$HERE/../materialize.py" "$tmp/impl" "${args[@]}" >/dev/null
  name=$(echo "$label" | sed -E 's#(\.\./)?edits/##g; s#\.edits##g')
  echo "== $name"
  "$PY" benchmarks/compile_attention_sm90.py --impl "$tmp/impl" --json "$J" --label "$name" | grep -E "^(ok|FAIL)|failure" || true
  rm -rf "$tmp"
done

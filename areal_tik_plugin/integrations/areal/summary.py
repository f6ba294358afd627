"""One line per run from ``tik_stats.jsonl`` files (the GPU recipe step prints these)::

    python -m areal_tik_plugin.integrations.areal.summary RUN.jsonl [RUN.jsonl ...] [--skip 1] [--json OUT]

Per run, over the steps after the first ``--skip`` (warm-up: JIT, torch.compile, CUDA-graph capture):
throughput (response tokens / step wall time), mean step wall time, AReaL's per-phase times
(``timeperf/*``: rollout, recompute forward, train step, weight update), importance-weight range and
the monitor's mismatch count; with a baseline and a tik run, the tik/baseline ratios.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

PHASES = ("rollout", "recompute_logp", "compute_advantage", "train_step", "update_weights")
TOKENS, WALL = "tik/throughput/response_tokens", "tik/throughput/step_wall_s"
IW = ("ppo_actor/update/importance_weight/min", "ppo_actor/update/importance_weight/max")


def _mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def summarize(path: str, skip: int = 1) -> dict:
    meta, rows = {}, []
    with open(path) as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                (meta.update(d["meta"]) if "meta" in d else rows.append(d))
    rows.sort(key=lambda r: r.get("step", 0))
    plan = meta.get("plan") or {}
    label = (meta.get("recipe") or {}).get("mode") or ("tik" if plan.get("enabled") else "baseline")
    out = {"label": label, "source": path, "steps": len(rows), "plan_mode": plan.get("mode"),
           "recompute_forward_planned": plan.get("recompute_forward")}
    if not rows:
        return out
    used = rows[skip:] if len(rows) > skip else rows
    out["measured_steps"] = len(used)
    out["warmup_steps"] = len(rows) - len(used)
    tok = sum(r.get(TOKENS, 0.0) for r in used)
    wall = sum(r.get(WALL, 0.0) for r in used)
    out["response_tokens_per_step"] = tok / len(used)
    out["tokens_per_s"] = tok / wall if wall > 0 else None
    out["step_s"] = wall / len(used)
    out["warmup_step_s"] = rows[0].get(WALL) if len(rows) > len(used) else None
    out["elapsed_s"] = rows[-1].get("elapsed_s")
    for p in PHASES:  # a phase that never ran (no recompute forward under tik) counts 0 s
        out[f"{p}_s"] = _mean([r.get(f"timeperf/{p}", 0.0) for r in used])
    out["recompute_steps"] = sum(1 for r in rows if "timeperf/recompute_logp" in r)
    lo = [r[IW[0]] for r in rows if IW[0] in r]
    hi = [r[IW[1]] for r in rows if IW[1] in r]
    out["importance_weight"] = [min(lo), max(hi)] if lo and hi else None
    mm = [r["tik/mismatch/mismatched_tokens"] for r in rows if "tik/mismatch/mismatched_tokens" in r]
    ck = [r["tik/mismatch/checked_tokens"] for r in rows if "tik/mismatch/checked_tokens" in r]
    out["monitor"] = {"checked_tokens": sum(ck), "mismatched_tokens": sum(mm)} if ck else None
    out["fallback_active"] = any(r.get("tik/fallback_active", 0.0) for r in rows)
    return out


def _f(x, spec):
    return format(x, spec) if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def line(s: dict) -> str:
    if not s.get("steps"):
        return f"{s['label']}: no steps logged ({s['source']})"
    iw = s.get("importance_weight")
    mon = s.get("monitor")
    return (f"{s['label']}: {s['measured_steps']} steps (+{s['warmup_steps']} warm-up {_f(s['warmup_step_s'], '.1f')} s) "
            f"| {_f(s['tokens_per_s'], '.0f')} tok/s | step {_f(s['step_s'], '.2f')} s | rollout {_f(s['rollout_s'], '.2f')} "
            f"recompute {_f(s['recompute_logp_s'], '.3f')} train {_f(s['train_step_s'], '.2f')} "
            f"weights {_f(s['update_weights_s'], '.2f')} s | IW [{_f(iw[0], '.7g') if iw else 'n/a'}, "
            f"{_f(iw[1], '.7g') if iw else 'n/a'}]"
            + (f" | monitor {mon['mismatched_tokens']:.0f}/{mon['checked_tokens']:.0f} tokens differ" if mon else "")
            + (" | FALLBACK" if s.get("fallback_active") else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m areal_tik_plugin.integrations.areal.summary", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--skip", type=int, default=1, help="warm-up steps left out of the means")
    ap.add_argument("--json", default=None, help="write the summaries here")
    a = ap.parse_args(argv)
    res, rc = {}, 0
    for p in a.runs:
        if not os.path.exists(p):
            print(f"{p}: missing", flush=True)
            rc = 1
            continue
        s = summarize(p, a.skip)
        res[s["label"]] = s
        print(line(s), flush=True)
        rc |= 0 if s.get("steps") else 1
    b, t = res.get("baseline"), res.get("tik")
    if b and t and b.get("tokens_per_s") and t.get("tokens_per_s"):
        res["tik_over_baseline"] = {"tokens_per_s": t["tokens_per_s"] / b["tokens_per_s"],
                                    "step_s": t["step_s"] / b["step_s"]}
        print(f"tik/baseline: throughput x{res['tik_over_baseline']['tokens_per_s']:.3f}, "
              f"step time x{res['tik_over_baseline']['step_s']:.3f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=2)
    return rc


if __name__ == "__main__":
    sys.exit(main())

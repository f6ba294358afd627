"""Writes plan.yaml (h200_attention) and cpu_plan.yaml (cpu_attention_smoke: the same steps, edits and
branches with that spec's workload names) for ``tik search run --driver plan``. The README explains
each step. Usage: ``python benchmarks/search_plans/h200_attention/gen_plan.py``.
"""

from __future__ import annotations

import os

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))

H200_PREFILL = [f"prefill_b{b}_L{L}" for b in (1, 4, 8, 16) for L in (1024, 4096, 8192)
                if not (L == 8192 and b >= 8)]
H200_TRAIN = [f"train_b{b}_L{L}" for b in (1, 4, 8, 16) for L in (1152, 4224, 8320) if not (L == 8320 and b >= 8)]
CPU_PREFILL = ["prefill_b1_L64"]

RISKS = {
    "tma": "(i)-(iv) unchanged by construction: _online_step / _merge are untouched and take the same operands; "
           "the only difference is the values loaded for keys past the sequence end in masked tiles (next "
           "sequence's keys or TMA zero fill instead of 0): their scores are replaced by -inf before the row max, "
           "so p = 0 and 0 * v = 0 in P@V and in the tensor-core row sum. A non-finite K/V value in a neighbouring "
           "sequence would still be masked in S but would give 0 * inf = NaN in P@V (not present in real K/V).",
    "bm128": "free knob: per warpgroup the wgmma shapes (m64 n64/n128/n16 k16) and the per-row instruction sequence "
             "are those of the 64-row program; only which tiles of a row take the unmasked form changes (the "
             "masked and unmasked forms are value-identical, contraction off).",
    "lpt": "none: the grid order decides which program runs when, never what a program computes; every row's "
           "reduction order and instructions are unchanged.",
    "st3": "free knob: pipelining depth changes when tiles arrive, not the order in which they are reduced.",
}


def steps_and_opps(prefill):
    tw = prefill
    opp = {
        "tma": dict(mechanism="prefill: K/V tiles of the packed layout through TMA tensor descriptors "
                              "(host TensorDescriptor [T, Hkv, D], box 64 x 1 x 128) instead of pointer tensors",
                    entry_points=["attention.prefill"], target_workloads=tw, priority=1.0, kind="initial",
                    evidence_notes="root prefill 0.55-0.61x cuDNN at 100-350 TFLOP/s (evidence/tik_v1 "
                                   "attention bench); sm_90 compile: 255 regs + 120 B spill (64x4 warps), with "
                                   "TMA 255 regs, 0 spill (compile_sm90.json)"),
        "bm128": dict(mechanism="prefill: 128 query rows on 8 warps (two warpgroups) per program",
                      entry_points=["attention.prefill"], target_workloads=tw, priority=0.8, kind="followup",
                      evidence_notes="with TMA the 64-row state fits without spills; 128 x 8 warps halves the "
                                     "K/V shared-memory traffic per FLOP (compile: 255 regs, 0 spill, 98 KiB smem)"),
        "lpt": dict(mechanism="prefill: grid (heads, query blocks reversed, batch): GQA heads adjacent, "
                              "longest causal blocks first",
                    entry_points=["attention.prefill"], target_workloads=tw, priority=0.6, kind="followup",
                    evidence_notes="causal work per query block grows linearly with its index; the root issues "
                                   "blocks shortest-first per head, so the last wave holds the longest ones"),
        "st3": dict(mechanism="prefill: 3 K/V pipeline stages (TMA buffers)",
                    entry_points=["attention.prefill"], target_workloads=tw, priority=0.4, kind="followup",
                    evidence_notes="TMA loads hold no registers; 3 stages: 115 KiB smem, 0 spill (compile)"),
    }
    effect = {
        "tma": "prefill: no spill (root 120 B/thread), fewer integer/address instructions per tile; expected "
               "x1.10-1.30 on prefill/train workloads, decode unchanged (same kernels).",
        "bm128": "prefill: K/V smem reads per FLOP halved; expected x1.05-1.15 on L >= 4K, neutral at 1K.",
        "lpt": "prefill: shorter tail wave; expected x1.02-1.06 at b1/b4 (few waves), neutral at b16.",
        "st3": "prefill: deeper K/V prefetch; expected x1.00-1.05.",
    }
    falsifier = {
        "tma": "bitwise suites fail (packed_vs_separate / prefix_decode), or prefill_b4_L8192 and "
               "prefill_b16_L4096 not faster than the root in the A/B rounds.",
        "bm128": "prefill_b4_L8192 / prefill_b16_L4096 not faster than the parent, or any prefill > 1.05x root.",
        "lpt": "no prefill workload faster than the parent by more than the round spread.",
        "st3": "no prefill workload faster than the parent; smem occupancy drops CTAs/SM (1 -> 1: none expected).",
    }

    def o(key, base, applies):
        return {"key": key, **opp[base], "applies_to": applies}

    def step(key, base, parents, promoted, verified, failed):
        return {"opportunity": key, "parents": parents, "edits": f"edits/{EDIT[base]}", "kind": "full_sequence",
                "expected_effect": effect[base], "numerical_risks": RISKS[base], "falsifier": falsifier[base],
                "on_promoted": promoted, "on_verified": verified, "on_failed": failed}

    def br(decision, interp, rationale, opps=()):
        d = {"decision": decision, "interpretation": interp, "rationale": rationale}
        if opps:
            d["opportunities"] = list(opps)
        return d

    initial = {
        "interpretation": "root E0000: prefill/train hold nearly all of T (unit weights, us); decode is < 2 % of T, "
                          "below improve_eps, so decode edits cannot be promoted on this spec; the prefill kernel "
                          "spills (255 regs + 120 B) at 64 x 4 warps",
        "rationale": "attack the prefill register budget first (TMA K/V), then tile height, grid order, stages",
        "opportunities": [o("tma", "tma", ["root"])],
    }
    order = ["tma", "bm128", "lpt", "st3"]
    steps = []

    def node(key, base, parent):
        """Step `key` (stage `base`) on `parent`; each branch names the next stage's opportunity by a key of
        its own: on the offspring when it was promoted (or, for TMA, verified: the spill-free tree is the
        base the later stages need), else on the parent."""
        i = order.index(base)
        nxt = order[i + 1] if i + 1 < len(order) else None
        if nxt is None:
            steps.append(step(key, base, [parent],
                br("ARCHIVE", f"{base} promoted", "end of this plan: the next plan continues from the audits"),
                br("ARCHIVE", f"{base} verified, not faster", "end of this plan"),
                br("ABANDON", f"{base} failed", "a failure stays as evidence")))
            return
        kp, kv, kf = f"{nxt}.{key}.P", f"{nxt}.{key}.V", f"{nxt}.{key}.F"
        keep = base == "tma"
        steps.append(step(key, base, [parent],
            br("CONTINUE", f"{base} promoted: the new best", f"{nxt} on it next", [o(kp, nxt, ["self"])]),
            br("CONTINUE" if keep else "ARCHIVE", f"{base} verified (bits kept), not faster",
               f"{nxt} on this spill-free intermediate" if keep else f"{nxt} on the parent instead",
               [o(kv, nxt, ["self" if keep else parent])]),
            br("RETRY", f"{base} failed (the audit's error is in this record)", f"{nxt} on the parent instead",
               [o(kf, nxt, [parent])])))
        node(kp, nxt, key)
        node(kv, nxt, key if keep else parent)
        node(kf, nxt, parent)

    node("tma", "tma", "root")
    return initial, steps


EDIT = {"tma": "tma_kv.edits", "bm128": "bm128_w8.edits", "lpt": "lpt_grid.edits", "st3": "stages3.edits"}


def write(path, prefill):
    initial, steps = steps_and_opps(prefill)
    plan = {"initial": initial, "steps": steps}
    with open(path, "w") as f:
        f.write("# generated by gen_plan.py (see README.md); edits/ are SEARCH/REPLACE blocks against each step's parent\n")
        yaml.safe_dump(plan, f, sort_keys=False, width=110)


if __name__ == "__main__":
    write(os.path.join(HERE, "plan.yaml"), H200_PREFILL + H200_TRAIN)
    write(os.path.join(HERE, "cpu_plan.yaml"), CPU_PREFILL)

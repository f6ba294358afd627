"""Writes plan.yaml (h200_attention), cpu_plan.yaml (cpu_attention_smoke: the same steps, edits and
branches with that spec's workload names) and cpu_plan_tma2d.yaml (the retry branch from its first step) for ``tik search run --driver plan``. The README explains
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
           "sequence would still be masked in S but would give 0 * inf = NaN in P@V, where the root reads 0 (README: semantic caveat).",
    "tma2d": "as the 3-D TMA step: only the values loaded for keys past the sequence end in masked tiles differ "
             "(next sequence's keys or zero fill instead of 0), masked to -inf before the row max, so p = 0 there.",
    "bm128": "free knob: per warpgroup the wgmma shapes (m64 n64/n128/n16 k16) and the per-row instruction sequence "
             "are those of the 64-row program; only which tiles of a row take the unmasked form changes (the "
             "masked and unmasked forms are value-identical, contraction off).",
    "lpt": "none: the grid order decides which program runs when, never what a program computes; every row's "
           "reduction order and instructions are unchanged.",
    "st3": "free knob: pipelining depth changes when tiles arrive, not the order in which they are reduced.",
    "fma": "(ii)/(iii) changed on every path at once, in the shared _online_step (prefill, extend, decode): "
           "p = exp2(fma(s, scale, -m)) rounds once where s*scale - m rounded twice, so the bits differ from the "
           "root's but stay equal across paths; the row max is unchanged bit for bit (max(s)*scale == "
           "max(s*scale) for scale > 0), so are the masking (-inf before the max), _merge and the final "
           "normalization. The instruction-family check sees fma on every path (equal sets). Accuracy vs fp32: "
           "one rounding fewer per score.",
}


def steps_and_opps(prefill, first="tma"):
    tw = prefill
    opp = {
        "tma": dict(mechanism="prefill: K/V tiles of the packed layout through TMA tensor descriptors "
                              "(host TensorDescriptor [T, Hkv, D], box 64 x 1 x 128) instead of pointer tensors",
                    entry_points=["attention.prefill"], target_workloads=tw, priority=1.0, kind="initial",
                    evidence_notes="root prefill 0.55-0.61x cuDNN at 100-350 TFLOP/s (evidence/tik_v1 "
                                   "attention bench); sm_90 compile: 255 regs + 120 B spill (64x4 warps), with "
                                   "TMA 255 regs, 0 spill (compile_sm90.json)"),
        "tma2d": dict(mechanism="prefill: K/V tiles through 2-D TMA descriptors [T, Hkv*D] (box 64 x 128 at column "
                                "h_kv*D; heads contiguous) instead of pointer tensors",
                      entry_points=["attention.prefill"], target_workloads=tw, priority=1.0, kind="retry",
                      evidence_notes="the 3-D descriptor step failed on the GPU (its audit); the 2-D form needs no "
                                     "rank-reducing reshape of the shared-memory tile"),
        "bm128": dict(mechanism="prefill: 128 query rows on 8 warps (two warpgroups) per program",
                      entry_points=["attention.prefill"], target_workloads=tw, priority=0.8, kind="followup",
                      evidence_notes="with TMA the 64-row state fits without spills; 128 x 8 warps halves the "
                                     "K/V shared-memory traffic per FLOP (compile: 255 regs, 0 spill, 98 KiB smem)"),
        "lpt": dict(mechanism="prefill: grid (heads, query blocks reversed, batch): GQA heads adjacent, "
                              "longest causal blocks first",
                    entry_points=["attention.prefill"], target_workloads=tw, priority=0.6, kind="followup",
                    evidence_notes="causal work per query block grows linearly with its index; the root issues "
                                   "blocks shortest-first per head, so the last wave holds the longest ones"),
        "fma": dict(mechanism="all paths: softmax shift as one fma, p = exp2(fma(s, scale, -m)), row max taken "
                              "on the raw scores times the scale (shared _online_step)",
                    entry_points=["attention.prefill", "attention.extend", "attention.decode"], target_workloads=tw,
                    priority=0.9, kind="followup",
                    evidence_notes="per score the root spends mul (scale), sub, ex2 on the FP32/MUFU pipes between "
                                   "the two wgmma of a tile; the fma form drops one of three FP32 ops per score "
                                   "(64 per thread per 64x64 tile at 4 warps); sm_90 compile: 252 regs, 0 spill"),
        "st3": dict(mechanism="prefill: 3 K/V pipeline stages (TMA buffers)",
                    entry_points=["attention.prefill"], target_workloads=tw, priority=0.4, kind="followup",
                    evidence_notes="TMA loads hold no registers; 3 stages: 115 KiB smem, 0 spill (compile)"),
    }
    effect = {
        "tma": "prefill: no spill (root 120 B/thread), fewer integer/address instructions per tile; expected "
               "x1.10-1.30 on prefill/train workloads, decode unchanged (same kernels).",
        "tma2d": "as the 3-D TMA step: no spill, fewer address instructions; expected x1.10-1.30 on prefill/train.",
        "bm128": "prefill: K/V smem reads per FLOP halved; expected x1.05-1.15 on L >= 4K, neutral at 1K.",
        "lpt": "prefill: shorter tail wave; expected x1.02-1.06 at b1/b4 (few waves), neutral at b16.",
        "st3": "prefill: deeper K/V prefetch; expected x1.00-1.05.",
        "fma": "prefill/train: one FP32 instruction fewer per score in the softmax between the tile's two MMAs; "
               "expected x1.03-1.08 on prefill/train, decode neutral to slightly faster.",
    }
    falsifier = {
        "tma": "bitwise suites fail (packed_vs_separate / prefix_decode), or prefill_b4_L8192 and "
               "prefill_b16_L4096 not faster than the root in the A/B rounds.",
        "tma2d": "a bitwise suite fails, or prefill_b4_L8192 / prefill_b16_L4096 not faster than the root.",
        "bm128": "prefill_b4_L8192 / prefill_b16_L4096 not faster than the parent, or any prefill > 1.05x root.",
        "lpt": "no prefill workload faster than the parent by more than the round spread.",
        "st3": "no prefill workload faster than the parent; smem occupancy drops CTAs/SM (1 -> 1: none expected).",
        "fma": "a bitwise suite fails (paths disagree) or accuracy vs fp32 fails, or prefill_b4_L8192 / "
               "prefill_b16_L4096 not faster than the parent by more than the round spread.",
    }

    def o(key, base, applies):
        return {"key": key, **opp[base], "applies_to": applies}

    def step(key, base, parents, promoted, verified, failed):
        return {"opportunity": key, "parents": parents, "edits": f"edits/{EDIT[base]}", "kind": "joint" if base == "fma" else "full_sequence",
                "expected_effect": effect[base], "numerical_risks": RISKS[base], "falsifier": falsifier[base],
                "on_promoted": promoted, "on_verified": verified, "on_failed": failed}

    def br(decision, interp, rationale, opps=()):
        d = {"decision": decision, "interpretation": interp, "rationale": rationale}
        if opps:
            d["opportunities"] = list(opps)
        return d

    initial = {
        "interpretation": "root E0000: prefill/train hold nearly all of T (unit weights, us); decode is ~3 % of T "
                          "(committed bench), so even halving decode gains ~1.5 % < improve_eps 2 %: decode edits "
                          "cannot be promoted on this spec; the prefill kernel spills (255 regs + 120 B) at "
                          "64 x 4 warps",
        "rationale": "attack the prefill register budget first (TMA K/V), then the softmax instruction count "
                     "(fma shift, every path), the grid order, the tile height",
        "opportunities": [o(first, first, ["root"])],
    }
    # next stage of each stage; the 2-D TMA form is the retry of a failed 3-D TMA step
    nxt_of = {"tma": "fma", "tma2d": "fma", "fma": "lpt", "lpt": "bm128", "bm128": None}
    steps = []

    def node(key, base, parent):
        """Step `key` (stage `base`) on `parent`; each branch names the next stage's opportunity by a key of
        its own: on the offspring when it was promoted (or, for TMA, verified: the spill-free tree is the
        base the later stages need), else on the parent. A failed TMA step is retried in the 2-D form; the
        other failures go on with the next stage on the parent. Trees that keep the root's pointer loads
        spill (compile_sm90.json), so a failed 2-D TMA step ends the plan."""
        nxt = nxt_of[base]
        if nxt is None:
            steps.append(step(key, base, [parent],
                br("ARCHIVE", f"{base} promoted", "end of this plan: the next plan continues from the audits"),
                br("ARCHIVE", f"{base} verified, not faster", "end of this plan"),
                br("ABANDON", f"{base} failed", "a failure stays as evidence")))
            return
        kp, kv, kf = f"{nxt}.{key}.P", f"{nxt}.{key}.V", f"{nxt}.{key}.F"
        keep = base in ("tma", "tma2d")
        if base == "tma":
            failed = br("RETRY", "3-D TMA failed (the audit's error is in this record)",
                        "retry the direction with 2-D descriptors (no rank-reducing reshape)",
                        [o(f"tma2d.{key}.F", "tma2d", [parent])])
        elif base == "tma2d":
            failed = br("ABANDON", "2-D TMA failed too", "without TMA the prefill spills (root: 120 B); end of "
                        "this plan, the next plan starts from the two audits' errors")
        else:
            failed = br("RETRY", f"{base} failed (the audit's error is in this record)", f"{nxt} on the parent instead",
                        [o(kf, nxt, [parent])])
        steps.append(step(key, base, [parent],
            br("CONTINUE", f"{base} promoted: the new best", f"{nxt} on it next", [o(kp, nxt, ["self"])]),
            br("CONTINUE" if keep else "ARCHIVE", f"{base} verified (bitwise contract held), not faster",
               f"{nxt} on this spill-free intermediate" if keep else f"{nxt} on the parent instead",
               [o(kv, nxt, ["self" if keep else parent])]),
            failed))
        node(kp, nxt, key)
        node(kv, nxt, key if keep else parent)
        if base == "tma":
            node(f"tma2d.{key}.F", "tma2d", parent)
        elif base != "tma2d":
            node(kf, nxt, parent)

    node(first, first, "root")
    return initial, steps


EDIT = {"tma": "tma_kv.edits", "tma2d": "tma2d_kv.edits", "bm128": "bm128_w8.edits", "lpt": "lpt_grid.edits", "st3": "stages3.edits",
        "fma": "fma_shift.edits"}


def write(path, prefill, first="tma"):
    initial, steps = steps_and_opps(prefill, first)
    plan = {"initial": initial, "steps": steps}
    with open(path, "w") as f:
        f.write("# generated by gen_plan.py (see README.md); edits/ are SEARCH/REPLACE blocks against each step's parent\n")
        yaml.safe_dump(plan, f, sort_keys=False, width=110)


if __name__ == "__main__":
    write(os.path.join(HERE, "plan.yaml"), H200_PREFILL + H200_TRAIN)
    write(os.path.join(HERE, "cpu_plan.yaml"), CPU_PREFILL)
    # the CPU run of the retry branch (2-D TMA first): the GPU plan reaches it only after a failed 3-D step
    write(os.path.join(HERE, "cpu_plan_tma2d.yaml"), CPU_PREFILL, first="tma2d")

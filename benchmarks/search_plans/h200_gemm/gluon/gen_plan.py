"""Writes the plan of the Gluon mid-M GEMM (kernels/tik_v7's gemm_gluon.py) for ``tik search run --driver plan``
from the root kernels/tik_v6: the first step takes kernels/tik_v7 as a complete tree (``from_dir``: the
candidate is that folder's source byte for byte), the later ones move one knob of it (edits/*.edits);
plan.yaml (h200_gemm) and cpu_plan.yaml (cpu_gemm_smoke: the same steps with that spec's workload names).
README.md beside this file explains each step. Usage: ``python benchmarks/search_plans/h200_gemm/gluon/gen_plan.py``.
"""

from __future__ import annotations

import importlib.util
import os

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "_attn_next_gen_plan", os.path.join(HERE, "..", "..", "h200_attention", "next", "gen_plan.py"))
_next = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_next)
br = _next.br   # the branch-record builder of the other plans
SRC = "gemm_gluon.py"
TREE = "../../../../kernels/tik_v7"     # relative to this folder (the plan driver resolves it from the plan file)

M256 = [f"{m}_{l}_M256" for m in ("q3_4b", "q3_8b") for l in ("qkv", "o", "gate_up", "down")]
M64 = [f"{m}_{l}_M64" for m in ("q3_4b", "q3_8b") for l in ("qkv", "o", "gate_up", "down")] + ["q25_1p5b_down_M64"]
M1024 = [f"{m}_{l}_M1024" for m in ("q3_4b", "q3_8b") for l in ("qkv", "o", "gate_up", "down")] + ["q25_1p5b_down_M1024"]
H200_TW = M256 + M1024
SMALL_TW = M64
CPU_TW = ["linear_M1_N80_K192", "linear_M7_N80_K192", "linear_M33_N80_K192_bias"]

# knob edits on the gws tree: (start of the line, its new start)
KNOB_EDITS = {
    "nosplit": ("SPLIT_ITEMS = True ", "SPLIT_ITEMS = False "),
    "m1024": ("MIN_M = 65 ", "MIN_M = 1024 "),
    "m33": ("MIN_M = 65 ", "MIN_M = 33 "),
}
EDIT = {k: f"edits/{k}.edits" for k in KNOB_EDITS}

MECH = {
    "gws": "mid-M dense linear (65 <= M <= 1024) on sm_90 in Gluon: a persistent program per SM, a producer warp's "
           "TMA ring, two consumer warpgroups' wgmma chains over 128-row tiles; split weights as (chunk, tile) items "
           "through an fp32 workspace and a ticket per tile half where the tiles alone leave SMs idle",
    "nosplit": "the Gluon kernel with whole-tile items only (SPLIT_ITEMS False: chunks summed in registers, no workspace)",
    "m1024": "the Gluon kernel at M = 1024 only (MIN_M 1024): M 65..1023 back on gemm.py's Triton kernels",
    "m33": "the Gluon kernel from M = 33 (MIN_M 33): decode-sized batches of 33..64 rows on 64-row tiles, one consumer "
           "warpgroup and a 12-deep ring streaming the weights",
}
EVIDENCE = ("tik_v6 on the H200 (evidence/probes/gemm/gemm_sweep-split-h200.json): M = 256 at 0.69x cuBLAS in geomean "
            "over the seven split-weight shapes, the best swept Triton tile per shape ~0.75x (Qwen3-8B down 65.6 us "
            "vs cuBLAS 45.5; its 25.8 GFLOP take 32.6 us at 790 TFLOP/s and its 100 MB of weights 23.4 us at 4.3 "
            "TB/s); sm_90 compile of tik_v7's kernel: 168 registers, 0 spill, 192 KB ring, wgmma m64nNk16, setmaxnreg "
            "256 / 232 / 24 as tik_v6's prefill (tests/kernels/test_gluon_gemm.py)")
EFFECT = {
    "gws": "M = 256 rows: one program per SM keeps its ring full across items (the Triton partial kernel drains and "
           "refills per program); predicted 8b down 76 -> ~48 us (3 items of 128 x 128 x 2048 per SM at ~75 % of the "
           "SM's wgmma rate + the workspace round trip, mostly in L2), 8b o 24 -> ~17, 4b down 45 -> ~30, 4b o 21 -> ~14; "
           "M = 1024 rows within +-10 % of tik_v6's persistent / split TMA kernels (the same tiles, whole-tile items). "
           "T (quick) x1.04-1.10 over tik_v6.",
    "nosplit": "isolates the workspace path: M = 256 split-weight rows slower by ~1.5-2x (64 tiles for 132 SMs); "
               "M = 1024 unchanged (whole tiles already).",
    "m1024": "isolates M = 256: those rows back to tik_v6's times; M = 1024 as gws.",
    "m33": "M = 64 rows (weight-bandwidth bound: Qwen3-4B o streams 21 MB, 4.9 us at 4.3 TB/s; tik_v6 12.5 us, cuBLAS "
           "10.0): the persistent ring keeps ~190 KB of weights in flight per SM across items where the Triton "
           "decode kernels refill per program; predicted x1.15-1.4 on those rows (tik_v6 is 0.93x cuBLAS there).",
}
RISKS = {
    "gws": "Each chunk is one chain of wgmma k16 steps, GEMM_BLOCK_K columns per step in increasing K, from zero into "
           "fp32 (the H200 contract evidence: that chain's bits do not depend on the tile shape, warps or wgmma vs "
           "mma.sync); chunk partials added in chunk order from 0, then + 0.0, the fp32 bias, one rounding -- gemm.py's "
           "arithmetic. Columns past K and rows past M / N are TMA zero fill, never stored. New failure modes are "
           "protocol ones: a ring slot released before both consumers' MMAs retired (wrong bits), a ticket not reset "
           "(the next call's reduce runs early: wrong bits on the repeat checks), an mbarrier phase off by one (a hang, "
           "cut by the evaluator's limit).",
    "nosplit": "none: the same chains, chunks summed in registers in chunk order (the large-M form).",
    "m1024": "none: which kernel runs M 65..1023, both computing the same chains.",
    "m33": "none new: the same chains on 64-row tiles (one consumer, the tickets of half 0 only); rows past M are TMA "
           "zero fill, never stored.",
}
FALSIFIER = {
    "gws": "q3_8b_down_M256 / q3_4b_down_M256 not faster than tik_v6 beyond the A/B spread (the persistent ring buys "
           "nothing over the partial kernel), or any M1024 row slower than 1.05x root.",
    "nosplit": "the M256 split-weight rows (4b / 8b o and down) not slower than gws: the workspace path buys nothing.",
    "m1024": "the M256 rows not slower than gws: the Gluon kernel buys nothing at M = 256.",
    "m33": "the M64 rows not faster than gws's (tik_v6's decode kernels) beyond the A/B spread.",
}


def opp(key, base, tw, applies, prio, kind="followup"):
    return {"key": key, "mechanism": MECH[base], "entry_points": ["gemm.linear"], "priority": prio, "kind": kind,
            "evidence_notes": EVIDENCE, "target_workloads": tw, "applies_to": applies}


def step(key, base, parent, promoted, verified, slower, failed):
    src = {"from_dir": TREE} if base == "gws" else {"edits": EDIT[base]}
    return {"opportunity": key, "parents": [parent], **src, "kind": "full_sequence",
            "expected_effect": EFFECT[base], "numerical_risks": RISKS[base], "falsifier": FALSIFIER[base],
            "on_promoted": promoted, "on_verified": verified, "on_slower": slower, "on_failed": failed}


def last(key, base, parent):
    return step(key, base, parent,
                br("ARCHIVE", f"{base} promoted: the new best", "end of this plan"),
                br("ARCHIVE", f"{base} verified, within improve_eps of gws", "end of this branch; its per-workload "
                   "latencies say what the knob it moved was worth"),
                br("ARCHIVE", f"{base} verified but slower than gws: the knob's old value pays", "not built on"),
                br("ABANDON", f"{base} failed (the audit's error is in this record)", "a failure stays as evidence"))


def plan(tw):
    w256 = [w for w in tw if w.endswith("M256")] or tw
    initial = {
        "interpretation": "root tik_v6 (every op's contract, tik verify and the SGLang proof pass on the H200); its GEMM "
                          "is 0.69x cuBLAS at M = 256 and 0.79-0.98x at M = 1024: Triton's kernels run one warpgroup's "
                          "loads and MMAs in one stream, a launch per tile or (tile, chunk), too few 128-row tiles for "
                          "132 SMs at M = 256",
        "rationale": "a warp-specialized persistent kernel over (chunk, tile) work items keeps every SM's ring full at "
                     "mid M; then take its parts away (the workspace items, the M < 1024 band) to see what each buys",
        "opportunities": [opp("gws", "gws", tw, ["root"], 1.0, "initial")],
    }
    w64 = [w for w in tw if w.endswith("M64")] or tw

    def follow(o):   # the band moved down, then the two ablations, on gws; keyed per branch (a key names one opportunity)
        return [opp(f"m33.gws.{o}", "m33", w64, ["gws"], 0.7), opp(f"nosplit.gws.{o}", "nosplit", w256, ["gws"], 0.6),
                opp(f"m1024.gws.{o}", "m1024", w256, ["gws"], 0.5)]

    steps = [
        step("gws", "gws", "root",
             br("CONTINUE", "gws promoted: the new best", "take its parts away on it: whole-tile items only, then the "
                "M < 1024 band back on Triton", follow("P")),
             br("CONTINUE", "gws verified, within improve_eps of tik_v6", "the same two ablations say which part holds "
                "it back", follow("V")),
             br("CONTINUE", "gws verified but slower than tik_v6 (or over a limit)", "not a parent for anything new; the "
                "ablations on it say whether the workspace items or the band is the loss", follow("S")),
             br("ABANDON", "gws failed (the audit's error is in this record: bits, or a hang cut by the limit)",
                "a failure stays as evidence; the next plan starts from its first error")),
        *[last(f"{k}.gws.{o}", k, "gws") for o in ("P", "V", "S") for k in ("m33", "nosplit", "m1024")],
    ]
    return {"root": "tik_v6", "initial": initial, "steps": steps}


def write_edits() -> None:
    with open(os.path.join(HERE, TREE, SRC)) as f:
        g = f.read()
    for k, (old, new) in KNOB_EDITS.items():
        line = next(x for x in g.splitlines() if x.startswith(old))
        with open(os.path.join(HERE, EDIT[k]), "w") as f:
            f.write(f"FILE: {SRC}\n<<<<<<< SEARCH\n{line}\n=======\n{line.replace(old, new, 1)}\n>>>>>>> REPLACE\n")


def write(path, tw):
    with open(path, "w") as f:
        f.write("# generated by gen_plan.py (root kernels/tik_v6; see README.md); paths are relative to this file\n")
        yaml.safe_dump(plan(tw), f, sort_keys=False, width=110)


if __name__ == "__main__":
    write_edits()
    write(os.path.join(HERE, "plan.yaml"), H200_TW + SMALL_TW)
    write(os.path.join(HERE, "cpu_plan.yaml"), CPU_TW)

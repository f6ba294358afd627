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
EDIT["rule"] = "edits/rule.edits"
# The measured rule (rule_plan.yaml): tik_v7's own plans, timed per shape by its probe on an H100
# (evidence/probes/gemm/gluon_gemm_probe-tik_v7.json), beat tik_v6 only unsplit with BLOCK_N 64 where K >= 4096
# and 2560 <= N <= 4096, at M = 64 (64-row tiles) and M = 256 (128-row tiles); everywhere else tik_v6's Triton
# kernels were as fast or faster, so the rule hands the kernel those shapes only.
RULE_EDITS = [
    ("gemm_gluon.py",
     "SPLIT_ITEMS = True      # False: every item a whole tile (no workspace, no tickets) unless a config asks for split\n",
     "SPLIT_ITEMS = False     # whole-tile items: unsplit BLOCK_N 64 beat the split plans at M = 256 in the probe\n"
     "# The shapes this kernel takes (M bands, K, N): where the probe's plans beat gemm.py's Triton kernels\n"
     "BANDS = ((33, 64), (129, 256))\n"
     "RULE_MIN_K = 4096\n"
     "RULE_N = (2560, 4096)\n"),
    ("gemm_gluon.py",
     "MIN_ITEMS_PER_SM = 0.5  # fewer items per SM (small N, one chunk): gemm.py's mid-M kernels (64-row tiles) instead\n",
     "MIN_ITEMS_PER_SM = 0.25  # the rule's shapes only: M = 64 on N 2560 is 40 tiles of 64 x 64, and won in the probe\n"),
    ("gemm_gluon.py",
     '    """Whether gemm.py hands an M-row problem to this kernel (MIN_M..MAX_M, a free knob)."""\n'
     "    return MIN_M <= M <= MAX_M\n",
     '    """Whether gemm.py may hand an M-row problem to this kernel (BANDS, a free knob)."""\n'
     "    return any(lo <= M <= hi for lo, hi in BANDS)\n"
     "\n"
     "\n"
     "def takes(M: int, N: int, K: int) -> bool:\n"
     '    """Whether this kernel runs the problem: M in BANDS, K >= RULE_MIN_K, N within RULE_N (free knobs)."""\n'
     "    return in_band(M) and K >= RULE_MIN_K and RULE_N[0] <= N <= RULE_N[1]\n"),
    ("gemm_gluon.py",
     "    return (SPLIT_ITEMS, SPLIT_MIN_WAVES, PROGRAMS_PER_SM, MIN_ITEMS_PER_SM, tuple(SPEED.items()),\n"
     "            tuple(STAGES.items()), HALVES_1_MAX_M)\n",
     "    return (SPLIT_ITEMS, SPLIT_MIN_WAVES, PROGRAMS_PER_SM, MIN_ITEMS_PER_SM, tuple(SPEED.items()),\n"
     "            tuple(STAGES.items()), HALVES_1_MAX_M, BANDS, RULE_MIN_K, RULE_N)\n"),
    ("gemm.py",
     "    g = _gluon()\n    p = g.plan(M, N, K, split_chunk(K), num_sms)\n",
     "    g = _gluon()\n    if not g.takes(M, N, K):\n        return {}\n    p = g.plan(M, N, K, split_chunk(K), num_sms)\n"),
]

MECH = {
    "gws": "mid-M dense linear (65 <= M <= 1024) on sm_90 in Gluon: a persistent program per SM, a producer warp's "
           "TMA ring, two consumer warpgroups' wgmma chains over 128-row tiles; split weights as (chunk, tile) items "
           "through an fp32 workspace and a ticket per tile half where the tiles alone leave SMs idle",
    "nosplit": "the Gluon kernel with whole-tile items only (SPLIT_ITEMS False: chunks summed in registers, no workspace)",
    "m1024": "the Gluon kernel at M = 1024 only (MIN_M 1024): M 65..1023 back on gemm.py's Triton kernels",
    "rule": "the Gluon kernel only where its probe beat tik_v6: unsplit BLOCK_N 64 tiles at M 33..64 (one consumer) "
            "and 129..256 (two), K >= 4096, 2560 <= N <= 4096 (Qwen3-4B / 8B o and down); other shapes on gemm.py's "
            "Triton kernels",
    "m33": "the Gluon kernel from M = 33 (MIN_M 33): decode-sized batches of 33..64 rows on 64-row tiles, one consumer "
           "warpgroup and a 12-deep ring streaming the weights",
}
EVIDENCE = ("tik_v6 on the H200 (evidence/probes/gemm/gemm_sweep-split-h200.json): M = 256 at 0.69x cuBLAS in geomean "
            "over the seven split-weight shapes, the best swept Triton tile per shape ~0.75x (Qwen3-8B down 65.6 us "
            "vs cuBLAS 45.5; its 25.8 GFLOP take 32.6 us at 790 TFLOP/s and its 100 MB of weights 23.4 us at 4.3 "
            "TB/s); sm_90 compile of tik_v7's kernel: 168 registers, 0 spill, 192 KB ring, wgmma m64nNk16, setmaxnreg "
            "256 / 232 / 24 as tik_v6's prefill (tests/kernels/test_gluon_gemm.py)")
RULE_EVIDENCE = ("tik_v7 on an H100 (evidence/probes/gemm/gluon_gemm_probe-tik_v7.json): tik_v6's bits on 72 rows and "
                 "every plan; per plan at M 256 unsplit BLOCK_N 64 beat tik_v6 on Qwen3-4B o / down and Qwen3-8B o / "
                 "down (16.8 / 35.9 / 20.2 / 55.7 us against 23.0 / 53.4 / 28.1 / 85.3; cuBLAS 13.8 / 32.7 / 19.3 / "
                 "53.8), at M 64 on 4B down and 8B o / down; run h200-gemm-gluon's nosplit step agrees at M 256 (root "
                 "23.1 / 52.1 / 27.7 / 83.5 -> 17.0 / 36.2 / 19.9 / 52.6 us); elsewhere tik_v6 as fast or faster")
EFFECT = {
    "gws": "M = 256 rows: one program per SM keeps its ring full across items (the Triton partial kernel drains and "
           "refills per program); predicted 8b down 76 -> ~48 us (3 items of 128 x 128 x 2048 per SM at ~75 % of the "
           "SM's wgmma rate + the workspace round trip, mostly in L2), 8b o 24 -> ~17, 4b down 45 -> ~30, 4b o 21 -> ~14; "
           "M = 1024 rows within +-10 % of tik_v6's persistent / split TMA kernels (the same tiles, whole-tile items). "
           "T (quick) x1.04-1.10 over tik_v6.",
    "rule": "from the probe's per-plan times on an H100 (the card lent): M = 256, Qwen3-4B o 23.0 -> 16.8 us, down "
            "53.4 -> 35.9, Qwen3-8B o 28.1 -> 20.2, down 85.3 -> 55.7; M = 64, 4B down 28.8 -> 27.0, 8B o 17.2 -> 16.5, "
            "8B down 49.5 -> 42.9; the other rows as tik_v6. M = 256 geomean against cuBLAS 0.74 -> 0.83 (short of "
            "0.90), M = 64 0.96 -> 0.98; T x1.03-1.04 over tik_v6 (~70 us of the quick spec's ~1850).",
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
    "rule": "none new: gws's chains on whole-tile items (chunks summed in registers in chunk order), on fewer shapes.",
    "nosplit": "none: the same chains, chunks summed in registers in chunk order (the large-M form).",
    "m1024": "none: which kernel runs M 65..1023, both computing the same chains.",
    "m33": "none new: the same chains on 64-row tiles (one consumer, the tickets of half 0 only); rows past M are TMA "
           "zero fill, never stored.",
}
FALSIFIER = {
    "gws": "q3_8b_down_M256 / q3_4b_down_M256 not faster than tik_v6 beyond the A/B spread (the persistent ring buys "
           "nothing over the partial kernel), or any M1024 row slower than 1.05x root.",
    "rule": "the 4B / 8B o and down rows at M 256 not faster than tik_v6 by >= 20 % (the probe's margin was 27-35 %), "
            "or any other row slower than root beyond the A/B spread (the rule hands them to the same Triton kernels).",
    "nosplit": "the M256 split-weight rows (4b / 8b o and down) not slower than gws: the workspace path buys nothing.",
    "m1024": "the M256 rows not slower than gws: the Gluon kernel buys nothing at M = 256.",
    "m33": "the M64 rows not faster than gws's (tik_v6's decode kernels) beyond the A/B spread.",
}


def opp(key, base, tw, applies, prio, kind="followup"):
    return {"key": key, "mechanism": MECH[base], "entry_points": ["gemm.linear"], "priority": prio, "kind": kind,
            "evidence_notes": RULE_EVIDENCE if base == "rule" else EVIDENCE, "target_workloads": tw, "applies_to": applies}


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


def rule_plan(tw):
    """gws (tik_v7's tree), then the measured rule on it: the rule is judged against the root, gws only carries it."""
    initial = {
        "interpretation": "tik_v7's Gluon GEMM gave tik_v6's bits on every probed shape but ran slower on most (M = 256 "
                          "geomean 0.68x cuBLAS against tik_v6's 0.74x, M = 1024 0.63x against 0.86x, on an H100); its "
                          "per-shape plans beat tik_v6 only unsplit with BLOCK_N 64 on the o / down weights",
        "rationale": "keep the kernel where it won and nowhere else: one rule, its prediction from the probe",
        "opportunities": [opp("gws", "gws", tw, ["root"], 1.0, "initial")],
    }
    w = [x for x in tw if x.endswith(("M256", "M64"))] or tw
    steps = [
        step("gws", "gws", "root",
             *[br("CONTINUE", f"gws {what}", "the measured rule on it", [opp(f"rule.gws.{o}", "rule", w, ["gws"], 0.9)])
               for what, o in (("promoted", "P"), ("verified, within improve_eps of tik_v6", "V"),
                               ("verified but slower than tik_v6, as its probe said", "S"))],
             br("ABANDON", "gws failed (the audit's error is in this record)", "the rule needs gws's bits")),
        *[last(f"rule.gws.{o}", "rule", "gws") for o in ("P", "V", "S")],
    ]
    return {"root": "tik_v6", "initial": initial, "steps": steps}


def write_rule_edits() -> None:
    blocks = [f"FILE: {f}\n<<<<<<< SEARCH\n{old}=======\n{new}>>>>>>> REPLACE\n" for f, old, new in RULE_EDITS]
    for f, old, _ in RULE_EDITS:
        with open(os.path.join(HERE, TREE, f)) as fh:
            n = fh.read().count(old)
        if n != 1:
            raise SystemExit(f"gen_plan: the rule's SEARCH text occurs {n} times in {f}; expected once")
    with open(os.path.join(HERE, EDIT["rule"]), "w") as fh:
        fh.write("".join(blocks))


def write_edits() -> None:
    with open(os.path.join(HERE, TREE, SRC)) as f:
        g = f.read()
    for k, (old, new) in KNOB_EDITS.items():
        line = next(x for x in g.splitlines() if x.startswith(old))
        with open(os.path.join(HERE, EDIT[k]), "w") as f:
            f.write(f"FILE: {SRC}\n<<<<<<< SEARCH\n{line}\n=======\n{line.replace(old, new, 1)}\n>>>>>>> REPLACE\n")


def write(path, tw, make=plan):
    with open(path, "w") as f:
        f.write("# generated by gen_plan.py (root kernels/tik_v6; see README.md); paths are relative to this file\n")
        yaml.safe_dump(make(tw), f, sort_keys=False, width=110)


if __name__ == "__main__":
    write_edits()
    write_rule_edits()
    write(os.path.join(HERE, "plan.yaml"), H200_TW + SMALL_TW)
    write(os.path.join(HERE, "cpu_plan.yaml"), CPU_TW)
    write(os.path.join(HERE, "rule_plan.yaml"), H200_TW + SMALL_TW, rule_plan)
    write(os.path.join(HERE, "cpu_rule_plan.yaml"), CPU_TW, rule_plan)

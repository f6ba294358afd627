"""Writes plan.yaml (h200_decode, root kernels/tik_v2) and cpu_plan.yaml (cpu_decode_smoke: the same steps, edits
and branches with that spec's workload names) for ``tik search run --driver plan``: the tile-parallel decode split
(README.md beside this file). Usage: ``python benchmarks/search_plans/h200_decode/par/gen_plan.py``.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import plan_kit  # noqa: E402  (beside this folder: the builders the decode plans share)

_base = plan_kit.base
H200_DECODE, H200_SMALL, CPU_DECODE = _base.H200_DECODE, _base.H200_SMALL, _base.CPU_DECODE
H200_LARGE = [w for w in H200_DECODE if w not in H200_SMALL]

EDIT = {"p4": "par4_small.edits", "p2L": "par2_large.edits", "p2": "par2_small.edits"}
SAME_BITS = ("every full tile is reduced by _online_update (the body of _online_step, now its callee) in absolute "
             "order on its own scores: a tile's scores are the columns of one wider dot(q, k^T) over the group's "
             "keys (a score is a per-element dot over D, the same k-chain at any N), times qk_scale elementwise; "
             "the slices are reshape / permute / split (data movement). Split ranges, the masked tile, the "
             "single-split merge, the workspace and the merge kernel are tik_v2's; ATTN_KV_TILE 64 / ATTN_SPLIT_KV "
             "512 unchanged; prefill and extend call _online_step, which inlines the same instructions. The group "
             "size is picked on the host from B, Hkv and max_context_len only (graph-capturable). Risk: that the "
             "wide dot's columns differ from the 64-wide dot's on the tensor cores (mma.sync m16n8k16 either way, "
             "k in the same order); the bitwise suites on the GPU decide it.")
EFFECT = {
    "p4": "decode, grids of at most 132 programs (b1 at every ctx, b4 / b8 at ctx <= 1024, b16 at ctx 128): the "
          "split's full tiles in groups of 4 (one 16 x 256 score dot, four independent exp2 / row-sum / P@V "
          "blocks, then four cheap elementwise state updates) instead of a chain where each tile's score dot, "
          "cross-warp max, layout change and P@V wait for the previous tile's. tik_v2 spends ~1.1 us per tile "
          "there (b1: ctx128 4.9 us for 2 tiles, ctx1024 13.7 us for 8 + the merge launch) and grouping the loads "
          "alone changed nothing (h200-decode-agent: 14.1 -> 14.0 us), so the chain, not the loads, is the cost. "
          "sm_90: 151-155 regs, 134 KiB smem, 1 CTA per SM (such grids have at most one program per SM), 0 spill; "
          "larger grids compile as tik_v2 (119-120 regs, 38 KiB). Predicted x1.4-1.9 on the small-grid cells "
          "(b1 ctx1024 ~8 us), larger grids unchanged: T(quick) x1.02-1.04.",
    "p2L": "decode, grids above 132 programs: groups of 2 tiles instead of 1 (120-153 regs, 70 KiB smem: 3 CTAs "
           "per SM instead of 4). Bandwidth-bound cells; the measured sensitivity to bytes in flight "
           "(3 CTAs x 32 KiB: 8-16 % slower) says the lost CTA costs, the shorter chain per pair of tiles may pay "
           "it back. Predicted x0.95-1.05 on the large cells: a measurement, not a bet.",
    "p2": "decode, grids of at most 132 programs: groups of 2 tiles (70 KiB smem) instead of 4, for when the "
          "4-tile group fails or is slower. Predicted x1.2-1.5 on the small-grid cells.",
}
FALSIFIER = {
    "p4": "decode_b1_ctx1024 / decode_b1_ctx8192 / decode_b8_ctx1024 not faster than tik_v2 beyond the round "
          "spread (the tile chain is not the cost), or a cell above 132 programs changed beyond it.",
    "p2L": "no large-grid cell faster than the parent beyond the round spread.",
    "p2": "decode_b1_ctx1024 / decode_b1_ctx8192 not faster than tik_v2 beyond the round spread.",
}
MECH = {
    "p4": "decode: full tiles of a split in tile-parallel groups of 4 on grids of at most 132 programs (one wide "
          "score dot, per-tile updates in order on its slices)",
    "p2L": "decode: tile-parallel groups of 2 on grids above 132 programs as well",
    "p2": "decode: tile-parallel groups of 2 (not 4) on grids of at most 132 programs",
}


EVIDENCE = ("tik_v2 decode b1 ctx1024 13.7 us vs cuDNN 7.0 (evidence/tik_v2 attention bench); "
            "h200-decode-agent: 2- and 4-tile load groups 0.924x / 1.001x, b1 ctx1024 unchanged; "
            "sm_90 compile facts in compile_sm90.json beside this plan")
K = plan_kit.Kit(EDIT, SAME_BITS, EFFECT, FALSIFIER, MECH, EVIDENCE, first="p4")
br = plan_kit.br


def plan(tw):
    initial = {
        "interpretation": "root tik_v2. Small grids are latency-bound (b1 ctx1024 13.7 us vs cuDNN 7.0, ~1.1 us per "
                          "64-key tile); grouping the loads did not move them (h200-decode-agent), so the serial "
                          "per-tile chain is the cost.",
        "rationale": "the only serial part the contract needs is the running (m, l, acc) update; scores, exp2, "
                     "row sums and P@V of a group of tiles can be formed together and folded in order",
        "opportunities": [K.opp("p4", "p4", tw, ["root"], 1.0)],
    }
    steps = [
        K.step("p4", "p4", "root",
             br("CONTINUE", "p4 promoted: the new best", "groups of 2 on the large grids on it next",
                [K.opp("p2L.P", "p2L", tw, ["self"], 0.6)]),
             br("CONTINUE", "p4 verified, not slower, below improve_eps",
                "groups of 2 on the large grids on it: the next rounds measure both against the best",
                [K.opp("p2L.V", "p2L", tw, ["self"], 0.6)]),
             br("ARCHIVE", "p4 verified but slower than tik_v2 (or over a limit)",
                "not built on; groups of 2 on the small grids instead", [K.opp("p2.S", "p2", tw, ["root"], 0.7)]),
             br("RETRY", "p4 failed (the audit's error is in this record)",
                "groups of 2 on the small grids instead", [K.opp("p2.F", "p2", tw, ["root"], 0.7)])),
        K.last("p2L.P", "p2L", "p4"),
        K.last("p2L.V", "p2L", "p4"),
        K.last("p2.S", "p2", "root"),
        K.last("p2.F", "p2", "root"),
    ]
    return {"root": "tik_v2", "initial": initial, "steps": steps}


def write(path, tw):
    plan_kit.write(path, plan(tw))


H200_TW = {"p4": H200_SMALL, "p2L": H200_LARGE, "p2": H200_SMALL}
CPU_TW = {k: CPU_DECODE for k in H200_TW}

if __name__ == "__main__":
    write(os.path.join(HERE, "plan.yaml"), H200_TW)
    write(os.path.join(HERE, "cpu_plan.yaml"), CPU_TW)

"""Writes plan.yaml (h200_decode, root kernels/tik_v2) and cpu_plan.yaml (cpu_decode_smoke: the same steps, edits
and branches with that spec's workload names) for ``tik search run --driver plan``: the tile-parallel decode
(README.md beside this file). Usage: ``python benchmarks/search_plans/h200_decode/tp/gen_plan.py``.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import plan_kit  # noqa: E402  (beside this folder: the builders the decode plans share)

_base = plan_kit.base
H200_DECODE, CPU_DECODE = _base.H200_DECODE, _base.CPU_DECODE

# cells each step's rule takes: split programs <= the limit and at least 4 tiles
H200_TP = [w for w in H200_DECODE
           if w != "decode_b64_mixed" and plan_kit.grid(w)[0] <= 132 and plan_kit.grid(w)[1] >= 4]
H200_TP264 = [w for w in H200_DECODE if w != "decode_b64_mixed" and 132 < plan_kit.grid(w)[0] <= 264]

EDIT = {"tp": "tp_chain.edits", "tp264": "tp_264.edits", "tpw2": "tp_chain_w2.edits"}
RISKS = ("a tile program forms the tile's P (_tile_p, the first half of _online_step, now its callee, so prefill / "
         "extend inline the same instructions; rounded to the cache dtype as there) and its row sums from the running "
         "max before it; that max is formed as max over the split's earlier tiles' scores (recomputed by the same "
         "dot(q, k^T) * qk_scale, kept as an elementwise max, reduced once), which is the value the chain reaches "
         "because max is exact in any order (a +-0 tie changes no exp2 argument's value). The chain kernel applies "
         "a split's tiles in order from (-inf, 0, 0) with _online_step's source lines: l * alpha + rs, and acc * alpha + "
         "dot(P, V), which the compiler folds into the dot's accumulator (tt.dot(P, V, acc * alpha)) on both "
         "paths, on V's BLOCK_D columns (a column of the product is its own dot); tik_v2's merge kernel merges the splits "
         "in order (_merge). A full tile goes through the masked form with an all-true mask (the same values). ATTN_KV_TILE "
         "64 / ATTN_SPLIT_KV 512 unchanged; the path is picked on the host from B, Hkv and max_context_len "
         "(graph-capturable). h200-decode-tp ran the form that formed P@V apart from the state (from zero, then "
         "added): the GPU suites refused it (batched_vs_single_decode, 46 of 64 rows), which is how the "
         "accumulator fold was found. The bitwise suites on the GPU decide it.")
EFFECT = {
    "tp": "decode on grids of at most 132 split programs with at least 4 tiles (b1 ctx1024-8192, b4 / b8 ctx1024): "
          "one program per 64-key tile (b1 ctx1024: 128 programs instead of 16) for scores, P and row sums; a chain "
          "kernel per (request, kv head, 32 head dims, split) that runs the split's in-order P@V chain (16 x 64 x "
          "32 per tile on one warp, each tile's inputs loaded three tiles ahead), then tik_v2's merge kernel. "
          "tik_v2's split programs are serial chains of up to 8 tiles (~1.1 us each, b1 ctx1024 13.7 us, cuDNN "
          "7.0); grouping the loads (h200-decode-agent) or the tiles' arithmetic (h200-decode-par) did not move "
          "them, and one chain per request (h200-decode-tp2) cost 1.8 us per tile because its loads were not "
          "prefetched. sm_90: tile kernel 167 regs, 20 KiB smem; chain 243 regs (1 warp), 4 KiB; 0 spill. "
          "Predicted b1 ctx1024 ~8-10 us (x1.4-1.7), b1 ctx4096 / 8192 x1.2-1.5, other cells unchanged: "
          "T(quick) x1.01-1.03.",
    "tp264": "the same path on grids of up to 264 split programs (b4 ctx4096, b16 ctx1024: 2048 tile programs, K "
             "re-read up to 4.5 x from L2). Predicted x0.9-1.2 on those two cells: a measurement of where the "
             "rule's limit belongs.",
    "tpw2": "the chain kernel on 2 warps (P@V columns split between them; 8 of 16 dot columns each): fewer "
            "registers per thread (243 on one warp) and two warps' loads in flight. Predicted x1.00-1.10 on the "
            "tile-parallel cells.",
}
FALSIFIER = {
    "tp": "decode_b1_ctx1024 / decode_b4_ctx1024 not faster than tik_v2 beyond the round spread, or a cell the "
          "rule does not take changed beyond it.",
    "tp264": "decode_b4_ctx4096 / decode_b16_ctx1024 not faster than the parent beyond the round spread.",
    "tpw2": "no tile-parallel cell faster than the parent beyond the round spread.",
}
MECH = {
    "tp": "decode: one program per 64-key tile on grids of at most 132 split programs (running max from the "
          "split's earlier tiles' scores), each split's tiles folded in order by a chain kernel",
    "tp264": "decode: the tile-parallel path on grids of up to 264 split programs",
    "tpw2": "decode: the tile-parallel chain kernel on 2 warps",
}


EVIDENCE = ("tik_v2 decode b1 ctx1024 13.7 us vs cuDNN 7.0 (evidence/tik_v2 attention bench); "
            "h200-decode-agent and h200-decode-par: grouped loads / grouped tile arithmetic in "
            "one split program did not move the small grids; sm_90 compile facts in "
            "compile_sm90.json beside this plan")
K = plan_kit.Kit(EDIT, RISKS, EFFECT, FALSIFIER, MECH, EVIDENCE, first="tp")


def plan(tw):
    initial = {
        "interpretation": "root tik_v2. Small grids are latency-bound (b1 ctx1024 13.7 us vs cuDNN 7.0, ~1.1 us per "
                          "64-key tile in a split program's serial chain); neither grouped loads nor grouped tile "
                          "arithmetic in one program moved them.",
        "rationale": "spread the split's tiles over programs: each tile's running max comes from the earlier "
                     "tiles' scores (exact in any order), its terms are independent, and a merge kernel folds "
                     "them in order",
        "opportunities": [K.opp("tp", "tp", tw, ["root"], 1.0)],
    }
    steps = [
        K.mid("tp", "tp", "root", "tpw2", "tpw2", tw),
        K.mid("tpw2.P", "tpw2", "tp", "tp264a", "tp264", tw),
        K.mid("tpw2.V", "tpw2", "tp", "tp264b", "tp264", tw),
        K.last("tp264a.P", "tp264", "tpw2.P"),
        K.last("tp264a.V", "tp264", "tpw2.P"),
        K.last("tp264a.S", "tp264", "tp"),
        K.last("tp264b.P", "tp264", "tpw2.V"),
        K.last("tp264b.V", "tp264", "tpw2.V"),
        K.last("tp264b.S", "tp264", "tp"),
    ]
    return {"root": "tik_v2", "initial": initial, "steps": steps}


def write(path, tw):
    plan_kit.write(path, plan(tw))


H200_TW = {"tp": H200_TP, "tp264": H200_TP264, "tpw2": H200_TP}
CPU_TW = {k: CPU_DECODE for k in H200_TW}

if __name__ == "__main__":
    write(os.path.join(HERE, "plan.yaml"), H200_TW)
    write(os.path.join(HERE, "cpu_plan.yaml"), CPU_TW)

"""Writes plan.yaml (h200_decode, root kernels/tik_v2) and cpu_plan.yaml (cpu_decode_smoke: the same steps, edits
and branches with that spec's workload names) for ``tik search run --driver plan``: the hand-prefetched decode
split loop (README.md beside this file). Usage: ``python benchmarks/search_plans/h200_decode/prefetch/gen_plan.py``.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import plan_kit  # noqa: E402  (beside this folder: the builders the decode plans share)

_base = plan_kit.base
H200_DECODE, CPU_DECODE = _base.H200_DECODE, _base.CPU_DECODE

# cells each step's rule takes: split programs <= the limit
H200_TP = [w for w in H200_DECODE if w != "decode_b64_mixed" and plan_kit.grid(w)[0] <= 132]
H200_TP264 = [w for w in H200_DECODE if w != "decode_b64_mixed" and 132 < plan_kit.grid(w)[0] <= 264]

EDIT = {"tp": "pf_small.edits", "tpw2": "pf_warps8.edits", "tp264": "pf_264.edits"}
RISKS = ("the full tiles of a split are reduced one at a time in absolute order by the same _online_step calls on "
         "the same K/V values; only where the loads are issued moves (the table entries two tiles ahead, K/V one "
         "tile ahead, into registers, masked past the last full tile: never reduced). Element offsets come from "
         "the same table entries by the same integer formula (_tab / _tab_off == _kv_offsets). The masked tile, "
         "split ranges, single-split merge, workspace and merge kernel are tik_v2's; prefill / extend and every "
         "shared helper untouched; ATTN_KV_TILE 64 / ATTN_SPLIT_KV 512 unchanged; the path is picked on the host "
         "from B, Hkv and max_context_len (graph-capturable). The bitwise suites on the GPU decide it.")
EFFECT = {
    "tp": "decode on grids of at most 132 split programs (b1 at every ctx, b4 / b8 ctx <= 1024, b16 ctx128): the "
          "full-tile loop with loads issued by hand ahead of use, 1 stage (plain loads into registers). Nsight "
          "Compute of tik_v2 at b1 ctx1024 (evidence/probes/ncu/ncu_decode-tik_v2.txt): 50 % of stall samples "
          "long-scoreboard, on the barrier after the K/V copies (53 of 257) and on the K/V address arithmetic "
          "waiting for the table loads (44): a tile waits for two round trips. Here the table wait is an "
          "iteration ahead and the K/V wait overlaps the current tile's reduction. sm_90: 203-213 regs, 22 KiB "
          "smem, 0 spill (2 CTAs per SM by registers; such grids have at most one program per SM); larger grids "
          "compile as tik_v2. Predicted x1.2-1.5 on b1 ctx1024-8192 and b4 / b8 ctx1024, T(quick) x1.01-1.03.",
    "tp264": "the prefetched loop on grids of up to 264 split programs (b4 ctx4096, b16 ctx1024; 2 CTAs per SM by "
             "registers). Predicted x0.95-1.10 there: a measurement of where the rule's limit belongs.",
    "tpw2": "the prefetched loop on 8 warps (half the registers per thread: the K/V tiles in flight are spread "
            "over twice the threads). Predicted x0.95-1.10 on the prefetched cells.",
}
FALSIFIER = {
    "tp": "decode_b1_ctx1024 / decode_b1_ctx8192 / decode_b4_ctx1024 not faster than tik_v2 beyond the round "
          "spread (the exposed waits are not the loads), or a cell the rule does not take changed beyond it.",
    "tp264": "decode_b4_ctx4096 / decode_b16_ctx1024 not faster than the parent beyond the round spread.",
    "tpw2": "no prefetched cell faster than the parent beyond the round spread.",
}
MECH = {
    "tp": "decode: the full-tile loop with the table loads two tiles and the K/V loads one tile ahead (registers) "
          "on grids of at most 132 split programs",
    "tp264": "decode: the prefetched loop on grids of up to 264 split programs",
    "tpw2": "decode: the prefetched loop on 8 warps",
}


EVIDENCE = ("tik_v2 decode b1 ctx1024 13.7 us vs cuDNN 7.0 (evidence/tik_v2 attention bench); "
            "Nsight Compute of tik_v2 at b1 ctx1024 (evidence/probes/ncu/ncu_decode-tik_v2.txt): "
            "the long-scoreboard waits are the table and K/V loads")
K = plan_kit.Kit(EDIT, RISKS, EFFECT, FALSIFIER, MECH, EVIDENCE, first="tp")


def plan(tw):
    initial = {
        "interpretation": "root tik_v2. Small grids are latency-bound (b1 ctx1024 13.7 us vs cuDNN 7.0, ~1.1 us per "
                          "64-key tile); Nsight Compute puts the waits on the table load and the K/V copies of "
                          "each tile, one after the other.",
        "rationale": "issue each tile's table load two tiles and its K/V one tile ahead of use, by hand",
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

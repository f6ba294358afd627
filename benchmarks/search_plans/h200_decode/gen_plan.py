"""Writes plan.yaml (h200_decode, root kernels/tik_v2) and cpu_plan.yaml (cpu_decode_smoke: the same steps, edits
and branches with that spec's workload names) for ``tik search run --driver plan``. README.md beside this file
explains each step and the byte / launch arithmetic behind the predictions.
Usage: ``python benchmarks/search_plans/h200_decode/gen_plan.py``.
"""

from __future__ import annotations

import os

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))

# decode cells of h200_decode that --quick keeps (an opportunity may name only workloads of the run's spec)
H200_DECODE = [f"decode_b{b}_ctx{c}" for b in (1, 4, 8, 16, 64) for c in (128, 1024, 4096, 8192)
               if (b, c) != (64, 8192)] + ["decode_b64_mixed"]
# grids of at most 132 programs (B x 8 kv heads x ceil(ctx / 512) splits): where the 4-tile rule applies
H200_SMALL = [f"decode_b{b}_ctx{c}" for b in (1, 4, 8, 16) for c in (128, 1024, 4096, 8192)
              if b * 8 * -(-c // 512) <= 132]
CPU_DECODE = ["decode_b1_ctx600", "decode_b2_ctx300", "decode_b3_mixed"]

EDIT = {"g2": "edits/kv_group2.edits", "s3": "edits/stages3.edits", "t4": "edits/tiles4_small_grid.edits",
        "small4": "edits/small4_on_root.edits"}

SAME_BITS = ("the tiles of a split are reduced one at a time in absolute order by the same _online_step calls on the "
             "same K/V values (loads are grouped, not the reduction); split ranges, the masked tile, the in-kernel "
             "single-split merge, the workspace and the ordered merge kernel are tik_v2's; no coupled constant "
             "(ATTN_KV_TILE 64, ATTN_SPLIT_KV 512) and no shared helper changes, so prefill / extend compile as in "
             "tik_v2. Risk: only that Triton lowers the grouped loop to different instructions for the same "
             "arithmetic; the per-path instruction check and every bitwise suite (decode rows at pages 1 / 16, "
             "contract_decode at every boundary, batched / graph decode) decide it.")
RISKS = {
    "g2": SAME_BITS,
    "s3": "free knob (DECODE_STAGES, KNOBS['free']): pipelining depth changes when the page / token-table and K/V "
          "loads are issued, not what is reduced or in which order.",
    "t4": SAME_BITS + " The group size is picked on the host from B, Hkv and max_context_len only (never from "
          "seq_lens values), so the call stays CUDA-graph capturable.",
    "small4": SAME_BITS,
}
EFFECT = {
    "g2": "decode: K/V loads issued two tiles (64 KiB) at a time instead of one (32 KiB). tik_v2's loop waits for "
          "all its copies at the top of each iteration and issues the next tile's only after reducing this one "
          "(ttgir: one buffer per K/V, async_wait num=0), so every tile exposes a full load latency; grouped, a "
          "split of 8 full tiles waits 4 times instead of 8. sm_90 compile: 151 regs (119), 70 KiB smem (38), 3 "
          "CTAs per SM (4): K/V in flight per SM 192 KiB (128). Large grids (bandwidth cells, ~95 % of T): tik_v2 "
          "reaches 3.5-3.8 TB/s where cuDNN reaches 4.25-4.4, and 96 KiB in flight per SM (DECODE_STAGES 3 on "
          "tik_v2, 3 CTAs x 32 KiB) measured 8-16 % slower than 128 KiB: predicted x1.05-1.12 there. Small grids "
          "(b1, b4-b16 at short ctx; latency cells): x1.1-1.3. T(quick) x1.05-1.10.",
    "s3": "decode: DECODE_STAGES 2 -> 3 on the tile groups: the next group's table loads go through cp.async an "
          "iteration ahead (at 2 they are synchronous loads between groups). On tik_v2 the same knob cost a CTA "
          "per SM (119 -> 153 regs) and was 8-16 % slower at large B, flat at b1 (13.7 -> 13.4 us); on the groups "
          "the kernel holds 151 -> 153 regs, 70 -> 71 KiB, still 3 CTAs per SM, so the table prefetch comes "
          "without the occupancy loss. Predicted x1.00-1.03 per cell, T x1.00-1.02 (likely below improve_eps).",
    "t4": "decode: grids of at most 132 programs (b1 at every ctx, b4 / b8 at ctx <= 1024, b16 at ctx 128) run "
          "4-tile groups (128 KiB in flight per program; 134 KiB smem, 1 CTA per SM, which such a grid leaves free "
          "anyway); larger grids keep the parent's groups of 2. A split of 8 full tiles waits twice instead of 4 "
          "times; the per-SM L2/HBM rate (128 KiB per group) bounds the gain. Predicted x1.05-1.15 on those 9 "
          "cells, none elsewhere: T x1.005-1.012 (they are ~8 % of T), below improve_eps: the step's value is "
          "the per-cell evidence.",
    "small4": "decode: tik_v2's one tile per iteration on grids above 132 programs (the groups of 2 were slower "
              "there) and 4-tile groups on grids of at most 132 programs (the latency cells). Predicted x1.1-1.3 "
              "on the 9 small-grid cells, tik_v2's times elsewhere: T x1.01-1.02.",
}
FALSIFIER = {
    "g2": "decode_b16_ctx8192 / decode_b64_ctx4096 / decode_b64_mixed not faster than tik_v2 beyond the round "
          "spread (the lost fourth CTA costs what the second tile in flight gains), or decode_b1_ctx1024 / "
          "decode_b1_ctx8192 not faster (the wait is not the exposed latency).",
    "s3": "no decode cell faster than the parent beyond the round spread, or any large-grid cell slower.",
    "t4": "decode_b1_ctx1024 / decode_b1_ctx8192 / decode_b8_ctx1024 not faster than the parent beyond the round "
          "spread, or any cell above 132 programs changed beyond it (it runs the parent's code).",
    "small4": "decode_b1_ctx1024 / decode_b1_ctx8192 not faster than tik_v2 beyond the round spread.",
}


def opp(key, base, tw, applies):
    d = {
        "g2": dict(mechanism="decode: full K/V tiles in groups of 2 per loop iteration (both tiles' loads issued "
                             "together), each tile reduced in absolute order as before",
                   entry_points=["attention.decode"], priority=1.0, kind="initial",
                   evidence_notes="tik_v2 decode vs the strongest baseline (evidence/tik_v1 attention, same decode "
                                  "kernel): graph ratios 0.51-0.96; b16 ctx4096 3.6 TB/s, cuDNN 4.25. Knob probe of "
                                  "this kernel (attn_decode_probe, kernels 3285341, git f8f233b): stages 3/4 and 8 "
                                  "warps slower at B >= 4, flat at b1; the ttgir shows one K/V buffer and a full "
                                  "wait per tile at every stage count"),
        "s3": dict(mechanism="decode: DECODE_STAGES 3 on the tile groups (table loads prefetched by cp.async)",
                   entry_points=["attention.decode"], priority=0.6, kind="followup",
                   evidence_notes="sm_90 compile (compile_sm90.json): groups of 2 at stages 2 / 3: 151 / 153 regs, "
                                  "70 / 71 KiB smem, 3 CTAs per SM either way"),
        "t4": dict(mechanism="decode: 4-tile groups for grids of at most 132 programs (host rule on B, Hkv, "
                             "max_context_len), groups of 2 above",
                   entry_points=["attention.decode"], priority=0.5, kind="followup",
                   evidence_notes="sm_90 compile: 4-tile groups 152-157 regs, 134-135 KiB smem (1 CTA per SM), "
                                  "0 spill"),
        "small4": dict(mechanism="decode: one tile per iteration as tik_v2 on grids above 132 programs, 4-tile "
                                 "groups on grids of at most 132",
                       entry_points=["attention.decode"], priority=0.7, kind="retry",
                       evidence_notes="groups of 2 everywhere were slower or failed (its audit): keep tik_v2's loop "
                                      "on the bandwidth cells, group only where programs <= SMs"),
    }[base]
    return {"key": key, **d, "target_workloads": tw[base], "applies_to": applies}


def br(decision, interp, rationale, opps=()):
    d = {"decision": decision, "interpretation": interp, "rationale": rationale}
    if opps:
        d["opportunities"] = list(opps)
    return d


def step(key, base, parent, promoted, verified, slower, failed):
    return {"opportunity": key, "parents": [parent], "edits": EDIT[base], "kind": "decode",
            "expected_effect": EFFECT[base], "numerical_risks": RISKS[base], "falsifier": FALSIFIER[base],
            "on_promoted": promoted, "on_verified": verified, "on_slower": slower, "on_failed": failed}


def last(key, base, parent):
    """A step that ends this plan on every branch."""
    return step(key, base, parent,
                br("ARCHIVE", f"{base} promoted: the new best", "end of this plan: the next plan continues from the audits"),
                br("ARCHIVE", f"{base} verified, not slower, below improve_eps", "end of this plan; its per-cell "
                   "latencies are the evidence for the next plan"),
                br("ARCHIVE", f"{base} verified but slower than its parent (or over a limit)", "not built on; end of "
                   "this plan"),
                br("ABANDON", f"{base} failed (the audit's error is in this record)", "a failure stays as evidence"))


def s3_step(key, parent_key, tag, tw):
    """Stages 3 on the groups; then the 4-tile rule on the best link (itself if promoted, else its parent)."""
    return step(key, "s3", parent_key,
                br("CONTINUE", "s3 promoted: the new best", "the 4-tile rule for small grids on it next",
                   [opp(f"t4.{tag}.P", "t4", tw, ["self"])]),
                br("ARCHIVE", "s3 verified, not slower, below improve_eps",
                   "not built on (no measured gain); the 4-tile rule on its parent, measured without it",
                   [opp(f"t4.{tag}.V", "t4", tw, [parent_key])]),
                br("ARCHIVE", "s3 verified but slower than its parent: the table prefetch does not pay",
                   "not built on; the 4-tile rule on its parent", [opp(f"t4.{tag}.S", "t4", tw, [parent_key])]),
                br("RETRY", "s3 failed (the audit's error is in this record)", "the 4-tile rule on its parent instead",
                   [opp(f"t4.{tag}.F", "t4", tw, [parent_key])]))


def plan(tw):
    initial = {
        "interpretation": "root tik_v2 (the promoted I0001 of h200-attn-agent; its decode kernels are tik_v1's). On "
                          "h200_decode every timed decode cell is in T; the two prefill cells are weight 0 (limits "
                          "only). Large grids are bandwidth-bound at 3.5-3.8 TB/s (cuDNN 4.25-4.4), small grids "
                          "latency-bound (b1 ctx1024 13.7 us vs cuDNN 7.0). Knob moves alone are falsified by the "
                          "probe of this kernel (stages 3 / 4: 0.86-0.93x at B >= 4, 1.00-1.02x at b1; 8 warps "
                          "0.80-0.97x; merge in the last split program 0.74-0.94x).",
        "rationale": "the ttgir of the split kernel shows why: one K/V buffer per load and a full wait per tile at "
                     "every stage count, so a program has one 32 KiB tile in flight and waits once per tile. Group "
                     "the loads (2 tiles per iteration) without touching the reduction; then the table prefetch on "
                     "the groups (stages 3), then 4-tile groups where programs <= SMs",
        "opportunities": [opp("g2", "g2", tw, ["root"])],
    }
    steps = [
        step("g2", "g2", "root",
             br("CONTINUE", "g2 promoted: the new best", "stages 3 on it next", [opp("s3.g2.P", "s3", tw, ["self"])]),
             br("CONTINUE", "g2 verified, not slower than tik_v2, below improve_eps",
                "stages 3 on it: the next A/B rounds measure both changes together against tik_v2",
                [opp("s3.g2.V", "s3", tw, ["self"])]),
             br("ARCHIVE", "g2 verified but slower than tik_v2 (or over a limit): the lost fourth CTA per SM costs "
                "more than the second tile in flight gains",
                "not built on; tik_v2's loop on large grids, 4-tile groups only where programs <= SMs",
                [opp("small4.g2.S", "small4", tw, ["root"])]),
             br("RETRY", "g2 failed (the audit's error is in this record)",
                "the grouped loop only on grids of at most 132 programs, tik_v2's loop elsewhere",
                [opp("small4.g2.F", "small4", tw, ["root"])])),
        s3_step("s3.g2.P", "g2", "s3P", tw),
        s3_step("s3.g2.V", "g2", "s3V", tw),
        last("t4.s3P.P", "t4", "s3.g2.P"),
        last("t4.s3P.V", "t4", "g2"),
        last("t4.s3P.S", "t4", "g2"),
        last("t4.s3P.F", "t4", "g2"),
        last("t4.s3V.P", "t4", "s3.g2.V"),
        last("t4.s3V.V", "t4", "g2"),
        last("t4.s3V.S", "t4", "g2"),
        last("t4.s3V.F", "t4", "g2"),
        last("small4.g2.S", "small4", "root"),
        last("small4.g2.F", "small4", "root"),
    ]
    return {"root": "tik_v2", "initial": initial, "steps": steps}


def write(path, tw):
    with open(path, "w") as f:
        f.write("# generated by gen_plan.py (root kernels/tik_v2; see README.md); edit paths are relative to this file\n")
        yaml.safe_dump(plan(tw), f, sort_keys=False, width=110)


H200_TW = {"g2": H200_DECODE, "s3": H200_DECODE, "t4": H200_SMALL, "small4": H200_SMALL}
CPU_TW = {k: CPU_DECODE for k in H200_TW}

if __name__ == "__main__":
    write(os.path.join(HERE, "plan.yaml"), H200_TW)
    write(os.path.join(HERE, "cpu_plan.yaml"), CPU_TW)

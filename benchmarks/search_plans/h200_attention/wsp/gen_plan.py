"""Writes the plan of the warp-specialized work-item prefill (kernels/tik_v6's attention_gluon.py) for
``tik search run --driver plan`` from the root kernels/tik_v5: edits/wsp.edits (tik_v5 -> tik_v6, as SEARCH /
REPLACE blocks derived from the two folders), the knob edits, plan.yaml (h200_attention) and cpu_plan.yaml
(cpu_attention_smoke: the same steps with that spec's workload names). README.md beside this file explains
each step. Usage: ``python benchmarks/search_plans/h200_attention/wsp/gen_plan.py``.
"""

from __future__ import annotations

import difflib
import importlib.util
import os

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("_attn_next_gen_plan", os.path.join(HERE, "..", "next", "gen_plan.py"))
_next = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_next)
br = _next.br   # one branch-record builder for the attention plans
KERNELS = os.path.join(HERE, "..", "..", "..", "..", "kernels")
SRC = "attention_gluon.py"

H200_PREFILL = [f"prefill_b{b}_L{L}" for b in (1, 4, 8, 16) for L in (1024, 4096, 8192)
                if not (L == 8192 and b >= 8)]
H200_TRAIN = [f"train_b{b}_L{L}" for b in (1, 4, 8, 16) for L in (1152, 4224, 8320) if not (L == 8320 and b >= 8)]
CPU_PREFILL = ["prefill_b1_L64"]

# knob edits on the wsp tree: (start of the line, its new start)
KNOB_EDITS = {
    "nopp": ("PP = 1 ", "PP = 0 "),
    "p1": ("PERSIST = 2 ", "PERSIST = 1 "),
}
# p0 runs on the root: tik_v5 -> tik_v6 with PERSIST 0, one file
P0 = ("PERSIST = 2 ", "PERSIST = 0 ")
EDIT = {"wsp": "edits/wsp.edits", "p0": "edits/wsp_p0.edits", **{k: f"edits/{k}.edits" for k in KNOB_EDITS}}


def blocks(old: str, new: str, context: int = 3, src: str = SRC) -> str:
    """SEARCH / REPLACE blocks turning ``old`` into ``new``: each changed run of lines with ``context`` lines
    around it, widened until its SEARCH text occurs once in ``old``; runs whose blocks would touch merge."""
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    ops = [op for op in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if op[0] != "equal"]
    spans = []   # [a_lo, a_hi, b_lo, b_hi] with context
    for _, i1, i2, j1, j2 in ops:
        lo, hi = max(0, i1 - context), min(len(a), i2 + context)
        blo, bhi = j1 - (i1 - lo), j2 + (hi - i2)
        while "".join(a[lo:hi]) and old.count("".join(a[lo:hi])) > 1 and (lo > 0 or hi < len(a)):
            lo, blo = (lo - 1, blo - 1) if lo > 0 else (lo, blo)
            hi, bhi = (hi + 1, bhi + 1) if hi < len(a) else (hi, bhi)
        if spans and lo <= spans[-1][1]:
            spans[-1][1], spans[-1][3] = max(spans[-1][1], hi), max(spans[-1][3], bhi)
        else:
            spans.append([lo, hi, blo, bhi])
    out = []
    for lo, hi, blo, bhi in spans:
        out.append(f"FILE: {src}\n<<<<<<< SEARCH\n{''.join(a[lo:hi])}=======\n{''.join(b[blo:bhi])}>>>>>>> REPLACE\n")
    return "".join(out)


def other_blocks() -> str:
    """The blocks of the other kernel files tik_v6 changes (attention.py's prefill skips the pos0 fill the
    Gluon program does not read); manifest.json is the search's own."""
    out = []
    for name in sorted(os.listdir(os.path.join(KERNELS, "tik_v6"))):
        if name == SRC or not name.endswith(".py"):
            continue
        with open(os.path.join(KERNELS, "tik_v5", name)) as f:
            a = f.read()
        with open(os.path.join(KERNELS, "tik_v6", name)) as f:
            b = f.read().replace("tik_v6", "tik_v5")
        if a != b:
            out.append(blocks(a, b, src=name))
    return "".join(out)


def write_edits() -> None:
    with open(os.path.join(KERNELS, "tik_v5", SRC)) as f:
        v5 = f.read()
    with open(os.path.join(KERNELS, "tik_v6", SRC)) as f:
        v6 = f.read()
    rest = other_blocks()
    with open(os.path.join(HERE, EDIT["wsp"]), "w") as f:
        f.write(blocks(v5, v6) + rest)
    line = next(x for x in v6.splitlines() if x.startswith(P0[0]))
    with open(os.path.join(HERE, EDIT["p0"]), "w") as f:
        f.write(blocks(v5, v6.replace(line, line.replace(P0[0], P0[1], 1), 1)) + rest)
    for k, (old, new) in KNOB_EDITS.items():
        line = next(x for x in v6.splitlines() if x.startswith(old))
        with open(os.path.join(HERE, EDIT[k]), "w") as f:
            f.write(f"FILE: {SRC}\n<<<<<<< SEARCH\n{line}\n=======\n{line.replace(old, new, 1)}\n>>>>>>> REPLACE\n")


RISKS = {
    "wsp": "every value is computed as in tik_v5's warp-specialized program (the instructions of attention.py's "
           "_online_step and _merge, FA3's order), so the bits are tik_v2's; what moves is which program runs which "
           "(query block, sequence, head pair), when the loads are issued, and that a split's first tile skips "
           "acc * alpha (acc is +0 and alpha 0 there: +0 either way on finite inputs; a NaN score would give a NaN "
           "row with or without it). New failure modes are protocol ones, not numerical: a work item taken twice or "
           "never (the counter, the item ring), or an mbarrier wait that never completes (a hang). The bitwise "
           "suites and the accuracy check on the GPU decide; the evaluator's limit turns a hang into a failed audit.",
    "nopp": "none: ping-pong orders the issue of the two consumers' MMAs, never a value.",
    "p1": "none: the items are dealt in rounds instead of taken from the counter; each is computed the same way.",
    "p0": "none: one program per item (tik_v5's launch shape) over the same per-item code.",
}
EFFECT = {
    "wsp": "prefill / train forward: tik_v5's Nsight Compute profile (b16 L1024: 480 us vs cuDNN 296; b4 L8192: "
           "4.47 ms vs 3.37) ran one 133 KB CTA per SM with ~6 us per CTA of prologue (Q and first K loads) and "
           "epilogue (stores) left uncovered; 31 CTAs per SM at b16 L1024 (~190 us), 62 at b4 L8192 (~370 us). One "
           "program per SM taking items in order covers them with the next item's loads, and ping-pong puts one "
           "consumer's softmax under the other's MMAs (FA3: +8-15 % at D 128). Predicted x1.15-1.5 on the L 1K "
           "cells, x1.08-1.20 at L >= 4K; T (quick) x1.10-1.25 over tik_v5.",
    "nopp": "the same without ping-pong: isolates its share (predicted 0.90-0.97x of wsp at L >= 4K).",
    "p1": "items dealt in snake rounds instead of the counter: the same on these equal-length cells within the "
          "round spread (its CPU model: max / mean work 1.02-1.03), one fewer atomic per item.",
    "p0": "one program per item (no persistence) with ping-pong and the schedule kept: isolates what the "
          "persistent loop gains or, after a failure, whether the counter / ring protocol was the cause.",
}
FALSIFIER = {
    "wsp": "prefill_b16_L1024 / prefill_b4_L1024 not faster than tik_v5 beyond the round spread (the prologue and "
           "epilogue were not the cost), or prefill_b4_L8192 slower (the counter / ring or the ping-pong cost more "
           "than they cover).",
    "nopp": "no prefill cell at L >= 4096 faster than wsp beyond the round spread means ping-pong pays nothing here.",
    "p1": "any cell slower than wsp beyond the round spread (the counter's atomics are free at this grain).",
    "p0": "the L 1K cells not slower than wsp (persistence gains nothing there).",
}
MECH = {
    "wsp": "prefill: warp-specialized program over work items (persistent, items from a counter, ping-pong "
           "consumers, the next item's loads under the current one's tail)",
    "nopp": "prefill: the work-item program without ping-pong (PP 0)",
    "p1": "prefill: the work-item program with items dealt in rounds (PERSIST 1)",
    "p0": "prefill: the work-item program, one program per item (PERSIST 0)",
}
EVIDENCE = ("tik_v5 (ws + FA3 order + rev) on the H200: prefill 0.75-0.82 cold / 0.77-0.84 graph vs cuDNN at L >= 4096, "
            "1K cells 0.26-0.63 (evidence/tik_v5/tik_v5-9f19cbf14c24-attention.json); Nsight Compute at b4 L8192 and "
            "b16 L1024 (evidence/probes/ncu/ncu_prefill-tik_v5.txt): one CTA per SM, tensor pipe 54.9 % vs cuDNN's "
            "71.1 %; sm_90 compile of tik_v6: 168 regs, 0 spill, 133.6 KB (tests/kernels/test_gluon_prefill.py)")


def opp(key, base, tw, applies, prio, kind="followup"):
    return {"key": key, "mechanism": MECH[base], "entry_points": ["attention.prefill"], "priority": prio,
            "kind": kind, "evidence_notes": EVIDENCE, "target_workloads": tw, "applies_to": applies}


def step(key, base, parent, promoted, verified, slower, failed):
    return {"opportunity": key, "parents": [parent], "edits": EDIT[base], "kind": "full_sequence",
            "expected_effect": EFFECT[base], "numerical_risks": RISKS[base], "falsifier": FALSIFIER[base],
            "on_promoted": promoted, "on_verified": verified, "on_slower": slower, "on_failed": failed}


def last(key, base, parent):
    return step(key, base, parent,
                br("ARCHIVE", f"{base} promoted: the new best", "end of this plan"),
                br("ARCHIVE", f"{base} verified, not slower, below improve_eps", "end of this plan; its per-cell "
                   "latencies are the evidence for the next one"),
                br("ARCHIVE", f"{base} verified but slower than its parent (or over a limit)", "not built on; end"),
                br("ABANDON", f"{base} failed (the audit's error is in this record)", "a failure stays as evidence"))


def nopp_steps(key, tw):
    """The ping-pong-off step ``key`` (on wsp) and the rounds step after each of its branches: on nopp when it
    was promoted, else on wsp."""
    promoted = f"p1.{key}.P"
    return [
        step(key, "nopp", "wsp",
             br("CONTINUE", "nopp promoted over wsp: ping-pong costs here", "rounds instead of the counter on it",
                [opp(promoted, "p1", tw, ["self"], 0.4)]),
             br("ARCHIVE", "nopp verified, within improve_eps of wsp", "not built on; rounds instead of the counter on wsp",
                [opp(f"p1.{key}.V", "p1", tw, ["wsp"], 0.4)]),
             br("ARCHIVE", "nopp slower: ping-pong pays", "rounds instead of the counter on wsp",
                [opp(f"p1.{key}.S", "p1", tw, ["wsp"], 0.4)]),
             br("ABANDON", "nopp failed", "a failure stays as evidence")),
        last(promoted, "p1", key),
        last(f"p1.{key}.V", "p1", "wsp"),
        last(f"p1.{key}.S", "p1", "wsp"),
    ]


def plan(tw):
    initial = {
        "interpretation": "root tik_v5 (tik_v2 with the Gluon prefill: warp-specialized, FA3's order, query blocks "
                          "last-first), whose prefill is 12-18 % faster than tik_v2's at L >= 4096 and host- and "
                          "prologue-bound at L 1K. Prefill and train forward are ~96 % of this spec's T.",
        "rationale": "cover the per-CTA prologue and epilogue with a persistent program and the softmax with the "
                     "other consumer's MMAs; then take each part away to see what it buys",
        "opportunities": [opp("wsp", "wsp", tw, ["root"], 1.0, "initial")],
    }
    steps = [
        step("wsp", "wsp", "root",
             br("CONTINUE", "wsp promoted: the new best", "ping-pong off on it next",
                [opp("nopp.wsp.P", "nopp", tw, ["self"], 0.6)]),
             br("CONTINUE", "wsp verified, not slower, below improve_eps", "ping-pong off on it next",
                [opp("nopp.wsp.V", "nopp", tw, ["self"], 0.6)]),
             br("ARCHIVE", "wsp verified but slower than tik_v5 (or over a limit)",
                "not built on; one program per item on the root next (is persistence the loss?)",
                [opp("p0.wsp.S", "p0", tw, ["root"], 0.5)]),
             br("RETRY", "wsp failed (the audit's error is in this record: bits, or a hang cut by the limit)",
                "the same per-item code, one program per item (no counter, no item ring)",
                [opp("p0.wsp.F", "p0", tw, ["root"], 0.5, "retry")])),
        *[x for o in ("P", "V") for x in nopp_steps(f"nopp.wsp.{o}", tw)],
        last("p0.wsp.S", "p0", "root"),
        last("p0.wsp.F", "p0", "root"),
    ]
    return {"root": "tik_v5", "initial": initial, "steps": steps}


def write(path, tw):
    with open(path, "w") as f:
        f.write("# generated by gen_plan.py (root kernels/tik_v5; see README.md); edit paths are relative to this file\n")
        yaml.safe_dump(plan(tw), f, sort_keys=False, width=110)


if __name__ == "__main__":
    write_edits()
    write(os.path.join(HERE, "plan.yaml"), H200_PREFILL + H200_TRAIN)
    write(os.path.join(HERE, "cpu_plan.yaml"), CPU_PREFILL)

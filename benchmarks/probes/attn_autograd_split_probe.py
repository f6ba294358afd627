"""Where the host time of one ``attention_varlen`` + ``torch.autograd.grad`` step goes (the step is
host-bound at short training sequences, ``attn_thread_probe``): the op's Python wrapper, the autograd
Function's forward and backward bodies, the kernel module's launches inside each, and what is left to
autograd's engine; each piece timed on the thread that runs it. A cProfile of the backward body on the
engine's thread names its top functions.

Usage: ``python -m benchmarks.probes.attn_autograd_split_probe [--cell 1x1152] --out DIR``. Writes
``attn_autograd_split_probe.json``; prints a table last.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import time

from benchmarks.probes._attn_cell import inputs, parse


def main(argv=None) -> int:
    args = parse(argv)
    import torch

    import areal_tik_plugin.ops.attention as OA
    from areal_tik_plugin.runtime import loader

    A = loader.current_module("attention")
    L, q, k, v, do, cu, (qg, kg, vg) = inputs(torch, args.cell)
    acc: dict = {}

    def add(name, dt):
        acc[name] = acc.get(name, 0.0) + dt

    def timed(name, f):
        def g(*a, **kw):
            t = time.perf_counter()
            try:
                return f(*a, **kw)
            finally:
                add(name, time.perf_counter() - t)
        return g

    prof = {"on": False, "p": None}
    fwd0, bwd0 = OA._AttnVarlen.forward, OA._AttnVarlen.backward

    def bwd(ctx, dout):
        if prof["on"]:
            prof["p"] = prof["p"] or cProfile.Profile()
            prof["p"].enable()
        t = time.perf_counter()
        try:
            return bwd0(ctx, dout)
        finally:
            add("Function.backward body", time.perf_counter() - t)
            if prof["on"]:
                prof["p"].disable()

    def step():
        t = time.perf_counter()
        out = OA.attention_varlen(qg, kg, vg, cu, L)
        t1 = time.perf_counter()
        g = torch.autograd.grad(out, (qg, kg, vg), do)
        t2 = time.perf_counter()
        add("attention_varlen (wrapper + Function.apply)", t1 - t)
        add("torch.autograd.grad", t2 - t1)
        return g

    OA._AttnVarlen.forward = staticmethod(timed("Function.forward body", fwd0))
    OA._AttnVarlen.backward = staticmethod(bwd)
    pf, pb = A.prefill, A.prefill_backward
    A.prefill, A.prefill_backward = timed("kernel module prefill()", pf), timed("kernel module prefill_backward()", pb)
    try:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        acc.clear()
        t = time.perf_counter()
        for _ in range(args.n):
            step()
        total = time.perf_counter() - t
        torch.cuda.synchronize()
        split = {name: s / args.n * 1e6 for name, s in acc.items()}
        prof["on"] = True  # the backward body, profiled on the engine's thread
        for _ in range(args.n):
            step()
        torch.cuda.synchronize()
        prof["on"] = False  # then the main thread (one profiler at a time: Python 3.12's are process-wide)
        main_prof = cProfile.Profile()
        main_prof.enable()
        for _ in range(args.n):
            step()
        main_prof.disable()
        torch.cuda.synchronize()
    finally:
        OA._AttnVarlen.forward, OA._AttnVarlen.backward = staticmethod(fwd0), staticmethod(bwd0)
        A.prefill, A.prefill_backward = pf, pb

    def top_of(p):
        rows = []
        for (file, line, name), (cc, nc, tt, ct, _) in pstats.Stats(p).stats.items():
            rows.append({"fn": f"{os.path.basename(file)}:{line}:{name}", "own_us_per_step": tt / args.n * 1e6,
                         "cum_us_per_step": ct / args.n * 1e6, "calls_per_step": nc / args.n})
        rows.sort(key=lambda r: -r["own_us_per_step"])
        return rows[:20]

    top = top_of(prof["p"]) if prof["p"] is not None else []
    main_top = top_of(main_prof)
    rec = {"schema": "areal-tik-attn-autograd-split-probe/1", "cell": args.cell,
           "implementation": loader.get_implementation().name, "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "host_us_per_step": total / args.n * 1e6,
           "split_us_per_step": split, "backward_profile": top, "main_thread_profile": main_top}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attn_autograd_split_probe.json"), "w") as f:
        json.dump(rec, f, indent=1)
    print(f"step host {rec['host_us_per_step']:.1f} us ({args.cell})")
    for name, us in split.items():
        print(f"  {name:<46} {us:8.1f} us")
    for label, rows in (("main", main_top), ("bwd", top)):
        for r in rows[:10]:
            print(f"  {label} profile {r['fn']:<56} own {r['own_us_per_step']:7.1f} cum {r['cum_us_per_step']:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Why the attention backward issues slower under autograd: host issue time of the direct backward on
the main thread, on one reused (warm) worker thread, and inside ``torch.autograd.grad``, with every
``_rowops.launch`` of the backward timed and classified (Triton fast path hit / fallback to
``fn.run``). Writes ``attn_thread_probe.json`` under ``--out``; prints a table last.

Usage: ``python -m benchmarks.probes.attn_thread_probe [--cell 1x1152] --out DIR``.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time

from benchmarks.probes._attn_cell import inputs, parse


def main(argv=None) -> int:
    args = parse(argv)
    import torch

    from areal_tik_plugin.ops.attention import attention_varlen
    from areal_tik_plugin.runtime import loader

    A = loader.current_module("attention")
    R = loader.current_module("_rowops")
    L, q, k, v, do, cu, (qg, kg, vg) = inputs(torch, args.cell)
    scale = q.shape[-1] ** -0.5
    o, lse = A.prefill(q, k, v, cu, L, scale, return_lse=True)

    stats = {"launch_s": 0.0, "launches": 0, "fallback_run": 0, "threads": set()}
    orig_launch = R._launch

    def timed_launch(fn, grid, *a, **kw):
        run0 = fn.run
        hit = {"run": False}

        def run(*x, **y):
            hit["run"] = True
            return run0(*x, **y)

        fn.run = run
        t = time.perf_counter()
        try:
            return orig_launch(fn, grid, *a, **kw)
        finally:
            stats["launch_s"] += time.perf_counter() - t
            stats["launches"] += 1
            stats["fallback_run"] += hit["run"]
            stats["threads"].add(threading.current_thread().name)
            del fn.run

    def bwd():
        return A.prefill_backward(do, q, k, v, o, lse, cu, L, scale)

    def autograd_step():
        out = attention_varlen(qg, kg, vg, cu, L)
        return torch.autograd.grad(out, (qg, kg, vg), do)

    jobs, done = queue.Queue(), queue.Queue()

    def worker():
        while True:
            f = jobs.get()
            if f is None:
                return
            done.put(f())

    w = threading.Thread(target=worker, name="warm-worker", daemon=True)
    w.start()

    def on_worker():
        jobs.put(bwd)
        return done.get()

    results = {}
    for name, fn in (("direct bwd, main thread", bwd), ("direct bwd, warm worker thread", on_worker),
                     ("attention_varlen + autograd.grad", autograd_step)):
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        R._launch = timed_launch
        for key in ("launch_s", "launches", "fallback_run"):
            stats[key] = 0
        stats["threads"] = set()
        t = time.perf_counter()
        for _ in range(args.n):
            fn()
        host = (time.perf_counter() - t) / args.n * 1e6
        R._launch = orig_launch
        torch.cuda.synchronize()
        results[name] = {"host_us_per_step": host, "launch_us_per_step": stats["launch_s"] / args.n * 1e6,
                         "launches_per_step": stats["launches"] / args.n,
                         "fallbacks_per_step": stats["fallback_run"] / args.n, "threads": sorted(stats["threads"])}
    jobs.put(None)
    rec = {"schema": "areal-tik-attn-thread-probe/1", "cell": args.cell, "implementation": loader.get_implementation().name,
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attn_thread_probe.json"), "w") as f:
        json.dump(rec, f, indent=1)
    for name, r in results.items():
        print(f"{name:<36} host {r['host_us_per_step']:8.1f} us  in launch() {r['launch_us_per_step']:8.1f} us  "
              f"launches {r['launches_per_step']:.0f}  fallbacks {r['fallbacks_per_step']:.1f}  threads {r['threads']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

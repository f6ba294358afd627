"""Where the training attention step's time goes outside the kernels: the same prefill + backward at
one policy-update cell timed (a) as direct kernel-module calls, (b) through ``attention_varlen`` +
``torch.autograd.grad`` (what the contract suite and the transformers integration run), (c) the
direct backward issued from another thread (autograd runs CUDA backward on its own device thread);
each cold (``do_bench`` median) and as host issue time (``bench.host_us``); plus the torch profiler's
top CPU entries of (b). Writes ``attn_train_host_probe.json`` under ``--out``; prints a table last.

Usage: ``python -m benchmarks.probes.attn_train_host_probe [--cells 1x1152,4x4224] --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", default="1x1152,4x1152,4x4224")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    import torch

    from areal_tik_plugin import bench
    from areal_tik_plugin.ops.attention import attention_varlen
    from areal_tik_plugin.runtime import loader

    A = loader.current_module("attention")
    Hq, Hkv, D = 32, 8, 128
    scale = D ** -0.5
    rows = []
    for cell in args.cells.split(","):
        Bn, L = (int(x) for x in cell.split("x"))
        T = Bn * L
        q, k, v, do = (torch.randn(T, h, D, device="cuda").to(torch.bfloat16) for h in (Hq, Hkv, Hkv, Hq))
        cu = torch.arange(0, T + 1, L, device="cuda", dtype=torch.int32)
        qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))

        def direct():
            o, lse = A.prefill(q, k, v, cu, L, scale, return_lse=True)
            return A.prefill_backward(do, q, k, v, o, lse, cu, L, scale)

        def op_autograd():
            o = attention_varlen(qg, kg, vg, cu, L)
            return torch.autograd.grad(o, (qg, kg, vg), do)

        def op_forward():
            with torch.no_grad():
                return attention_varlen(q, k, v, cu, L)

        o, lse = A.prefill(q, k, v, cu, L, scale, return_lse=True)

        def bwd_direct():
            return A.prefill_backward(do, q, k, v, o, lse, cu, L, scale)

        def bwd_thread():
            t = threading.Thread(target=bwd_direct)
            t.start()
            t.join()

        row = {"cell": cell, "cold_us": {}, "host_us": {}}
        for name, fn in (("direct fwd+bwd", direct), ("attention_varlen + autograd.grad", op_autograd),
                         ("attention_varlen forward (no grad)", op_forward), ("direct bwd", bwd_direct),
                         ("direct bwd from a new thread", bwd_thread)):
            fn()
            torch.cuda.synchronize()
            row["cold_us"][name] = bench.time_cold_us(fn)
            row["host_us"][name] = bench.host_us(fn, n=50, reps=3, warmup=5)
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                op_autograd()
            torch.cuda.synchronize()
        row["profile_cpu_top"] = prof.key_averages().table(sort_by="cpu_time_total", row_limit=18)
        rows.append(row)
        del q, k, v, do, qg, kg, vg, o, lse
        torch.cuda.empty_cache()
    impl = loader.get_implementation()
    rec = {"schema": "areal-tik-attn-train-host-probe/1", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "implementation": impl.name, "source_hash": impl.source_hash[:12] if hasattr(impl, "source_hash") else None,
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attn_train_host_probe.json"), "w") as f:
        json.dump(rec, f, indent=1)
    for r in rows:
        print(r["profile_cpu_top"][:3000])
    for r in rows:
        for name in r["cold_us"]:
            print(f"{r['cell']:>8} {name:<40} cold {r['cold_us'][name]:9.1f} us  host {r['host_us'][name]:9.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

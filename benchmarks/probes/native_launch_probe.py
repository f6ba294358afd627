"""The generic native launcher (``areal_tik_plugin.runtime.native.launch``) on the GPU: per public-op call,
the outputs with the launcher on equal, bit for bit, the outputs of Triton's own launch path on the same
inputs, and host issue time / cold time (do_bench, L2 flushed) / kernel-only cold time (events behind a GPU
sleep) with the launcher off and on; the launcher's counters (served launches, refused classes and why).

Usage: ``python -m benchmarks.probes.native_launch_probe --out DIR``. Writes ``native_launch_probe.json``;
prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks.probes.tma_host_probe import kernel_cold_us


def _cases(torch, ops, gen):
    dev = "cuda"
    bf16 = torch.bfloat16

    def rnd(*shape, dtype=bf16, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=gen) * scale).to(dtype)

    out = []
    for M, N, K in ((1, 6144, 2560), (64, 6144, 2560), (256, 2048, 1536), (256, 2560, 4096), (1024, 1536, 1536),
                    (4096, 6144, 2560)):
        x, w = rnd(M, K), rnd(N, K, scale=K ** -0.5)
        out.append((f"linear M{M} N{N} K{K}", lambda x=x, w=w: (ops.linear(x, w),)))
    Hq, Hkv, D = 32, 8, 128
    for Bn, L in ((1, 1024), (4, 1024), (1, 4096)):
        T = Bn * L
        q, k, v = rnd(T, Hq, D), rnd(T, Hkv, D), rnd(T, Hkv, D)
        cu = torch.arange(0, T + 1, L, device=dev, dtype=torch.int32)
        out.append((f"attention_varlen {Bn}x{L}", lambda q=q, k=k, v=v, cu=cu, L=L: (ops.attention_varlen(q, k, v, cu, L),)))
    Bn, L = 1, 1152
    T = Bn * L
    qg, kg, vg = (rnd(T, h, D).requires_grad_() for h in (Hq, Hkv, Hkv))
    do = rnd(T, Hq, D)
    cu1 = torch.tensor([0, T], device=dev, dtype=torch.int32)

    def train():
        o = ops.attention_varlen(qg, kg, vg, cu1, L)
        return (o.detach(),) + torch.autograd.grad(o, (qg, kg, vg), do)

    out.append((f"attention fwd+bwd {Bn}x{L}", train))
    B, ctx, slots = 16, 1000, 16 * 1024
    kc, vc = rnd(slots, Hkv, D), rnd(slots, Hkv, D)
    table = torch.randperm(slots, device=dev, generator=gen).to(torch.int32).view(B, 1024)
    rows = torch.arange(B, device=dev, dtype=torch.int32)
    lens = torch.full((B,), ctx, device=dev, dtype=torch.int32)
    qd = rnd(B, Hq, D)
    out.append(("attention_decode B16 ctx1000", lambda: (ops.attention_decode(qd, kc, vc, seq_lens=lens, kv_indices=table,
                                                                             table_rows=rows, max_context_len=1024),)))
    ext = 100
    qe = rnd(B * ext, Hq, D)
    cue = torch.arange(0, B * ext + 1, ext, device=dev, dtype=torch.int32)
    pre = torch.full((B,), ctx - ext, device=dev, dtype=torch.int32)
    out.append(("attention_extend B16 x100 prefix900", lambda: (ops.attention_extend(
        qe, kc, vc, cu_seqlens_q=cue, prefix_lens=pre, kv_indices=table, table_rows=rows, max_extend_len=ext),)))
    for Tn in (1, 77, 4096):
        h = rnd(Tn, 2560)
        wn = rnd(2560)
        gu = rnd(Tn, 2 * 9728)
        qr, kr = rnd(Tn, Hq, D), rnd(Tn, Hkv, D)
        pos = torch.arange(Tn, device=dev, dtype=torch.int64)
        inv = 1.0 / (1e6 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
        out.append((f"rms_norm T{Tn}", lambda h=h, wn=wn: (ops.rms_norm(h, wn, 1e-6),)))
        out.append((f"swiglu_fused T{Tn}", lambda gu=gu: (ops.swiglu_fused(gu),)))
        out.append((f"apply_rope T{Tn}", lambda qr=qr, kr=kr, pos=pos, inv=inv: tuple(ops.apply_rope(qr.clone(), kr.clone(), pos, inv))))
    for Tn in (1, 1024):
        lg = rnd(Tn, 151936)
        tok = torch.randint(0, 151936, (Tn,), device=dev, generator=gen)
        out.append((f"token_logprobs T{Tn}", lambda lg=lg, tok=tok: (ops.token_logprobs(lg, tok),)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", default="", help="comma list of case-name prefixes")
    args = ap.parse_args(argv)
    import torch
    import triton

    from areal_tik_plugin import bench, ops
    from areal_tik_plugin.runtime import loader, native
    from areal_tik_plugin.runtime.native import launch as NL

    gen = torch.Generator(device="cuda").manual_seed(0)
    cases = _cases(torch, ops, gen)
    if args.only:
        keep = [p for p in args.only.split(",") if p]
        cases = [c for c in cases if any(c[0].startswith(p) for p in keep)]
    on_module = NL._module()
    if on_module is None:
        raise SystemExit("native_launch_probe: the native module is off (TIK_NATIVE, no CUDA or another Triton)")
    results = []

    def timings(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        return {"host_us": bench.host_us(fn, n=100, reps=3, warmup=3),
                "cold_us": float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3,
                "gpu_cold_us": kernel_cold_us(fn, n=30)}

    for name, fn in cases:
        row = {"case": name}
        try:
            NL._STATE["m"] = None
            ref = [t.clone() for t in fn()]
            off = timings(fn)
            NL._STATE["m"] = on_module
            before = on_module.stats()["launch"]
            for _ in range(3):
                got = [t.clone() for t in fn()]
            torch.cuda.synchronize()
            after = on_module.stats()["launch"]
            row["bit_identical"] = len(ref) == len(got) and all(
                a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.dtype != torch.bool else a,
                                                                         b.view(torch.uint8) if b.dtype != torch.bool else b)
                for a, b in zip(ref, got))
            row["served_launches_in_3_calls"] = after["hits"] - before["hits"]
            on = timings(fn)
            row.update(off=off, on=on, host_ratio=off["host_us"] / on["host_us"], cold_ratio=off["cold_us"] / on["cold_us"])
        except Exception as e:  # noqa: BLE001 -- a failing case is the finding
            row["error"] = f"{type(e).__name__}: {e}"[:500]
        finally:
            NL._STATE["m"] = on_module
        results.append(row)
        print(f"... {name}: {row.get('error') or row.get('bit_identical')}", flush=True)
    st = native.stats()
    rec = {"schema": "areal-tik-native-launch-probe/1", "implementation": loader.get_implementation().name,
           "source_hash": loader.get_implementation().source_hash, "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "triton": triton.__version__, "results": results,
           "launch_stats": st.get("launch"), "refused_kernels": {getattr(k, "__name__", repr(k)): v
                                                                  for k, v in NL.REFUSED_KERNELS.items()}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "native_launch_probe.json"), "w") as f:
        json.dump(rec, f, indent=1, default=repr)
    print(f"{'case':<36} {'bits':>4} {'served':>6} | host off/on us  | cold off/on us  | kernel cold off/on")
    for r in results:
        if "error" in r:
            print(f"{r['case']:<36} ERROR {r['error'][:150]}")
            continue
        o, n = r["off"], r["on"]
        print(f"{r['case']:<36} {'ok' if r['bit_identical'] else 'DIFF':>4} {r['served_launches_in_3_calls']:>6} | "
              f"{o['host_us']:6.1f} {n['host_us']:6.1f} | {o['cold_us']:7.1f} {n['cold_us']:7.1f} | "
              f"{o['gpu_cold_us']:7.1f} {n['gpu_cold_us']:7.1f}")
    print("launch stats:", {k: v for k, v in (st.get("launch") or {}).items()}, "refused kernels:", rec["refused_kernels"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

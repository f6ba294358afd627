"""Attention training step (prefill forward with LSE + backward) of implementation folders against
torch SDPA cuDNN and FA2 fwd+bwd, same process, cold L2 (``triton.testing.do_bench`` median), at the
H200 spec's heads (32 q / 8 kv, D 128, bf16) and the policy-update lengths L + 128. Each backward
config of ``--configs`` (JSON list of ``prefill_backward(config=...)`` overrides; implementations
whose ``prefill_backward`` has no ``config`` run their default only) is also checked against an fp32
SDPA math reference (relative L2 of dq, dk, dv) and for determinism (two calls, equal bits).

Usage: ``python -m benchmarks.probes.attn_bwd_probe --impls kernels/tik_v2,kernels/tik_v3
[--configs '[{"per_head": true}]'] [--cells 1x1152,4x4224] --out DIR``; prints a table last.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import time

CELLS = "1x1152,4x1152,16x1152,1x4224,4x4224,1x8320,4x8320"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impls", required=True)
    ap.add_argument("--configs", default="[]")
    ap.add_argument("--cells", default=CELLS)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from areal_tik_plugin.runtime import loader

    Hq, Hkv, D = 32, 8, 128
    scale = D ** -0.5
    dev = "cuda"
    configs = json.loads(args.configs)
    impls = [p for p in args.impls.split(",") if p]
    mods = {os.path.basename(p.rstrip("/")): loader.load_implementation(p).module("attention") for p in impls}
    rows = []

    def bench(fn):
        return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")) * 1e3

    for cell in args.cells.split(","):
        Bn, L = (int(x) for x in cell.split("x"))
        g = torch.Generator(device=dev).manual_seed(Bn * 100003 + L)
        T = Bn * L
        q, k, v, do = (torch.randn(T, h, D, device=dev, generator=g).to(torch.bfloat16) for h in (Hq, Hkv, Hkv, Hq))
        cu = torch.arange(0, T + 1, L, device=dev, dtype=torch.int32)
        qs, ks, vs, dos = (x.view(Bn, L, -1, D).transpose(1, 2).contiguous() for x in (q, k, v, do))
        qs, ks, vs = (x.requires_grad_() for x in (qs, ks, vs))
        row = {"cell": cell, "B": Bn, "L": L, "flops_fwd_bwd": 3.5 * 4 * Bn * Hq * L * L * D / 2, "ours": {}, "baselines": {}}

        def sdpa(be):
            def fn():
                with sdpa_kernel([be]):
                    o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
                return torch.autograd.grad(o, (qs, ks, vs), dos)
            return fn

        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("fa2", SDPBackend.FLASH_ATTENTION)):
            try:
                row["baselines"][name] = bench(sdpa(be))
            except Exception as e:  # noqa: BLE001 -- an unavailable baseline is recorded, not fatal
                row["baselines"][name] = None
                row.setdefault("errors", []).append(f"{name}: {type(e).__name__}: {str(e)[:200]}")
        ref = None
        if T <= 8320:
            with sdpa_kernel([SDPBackend.MATH]):
                qr, kr, vr = (x.detach().float().requires_grad_() for x in (qs, ks, vs))
                orf = F.scaled_dot_product_attention(qr, kr, vr, is_causal=True, enable_gqa=True)
                ref = [x.transpose(1, 2).reshape(T, -1, D) for x in torch.autograd.grad(orf, (qr, kr, vr), dos.float())]
                del qr, kr, vr, orf
        for iname, A in mods.items():
            has_cfg = "config" in inspect.signature(A.prefill_backward).parameters
            for cfg in ([None] + (configs if has_cfg else [])):
                key = iname + ("" if cfg is None else " " + json.dumps(cfg, sort_keys=True))
                kw = {"config": cfg} if cfg else {}
                o, lse = A.prefill(q, k, v, cu, L, scale, return_lse=True)

                def fb():
                    o, lse = A.prefill(q, k, v, cu, L, scale, return_lse=True)
                    return A.prefill_backward(do, q, k, v, o, lse, cu, L, scale, **kw)

                g1 = g2 = None
                try:
                    g1 = A.prefill_backward(do, q, k, v, o, lse, cu, L, scale, **kw)
                    g2 = A.prefill_backward(do, q, k, v, o, lse, cu, L, scale, **kw)
                    torch.cuda.synchronize()
                    det = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(g1, g2))
                    rel = ([float((a.float() - b).norm() / b.norm()) for a, b in zip(g1, ref)] if ref is not None else None)
                    t_fb = bench(fb)
                    t_b = bench(lambda: A.prefill_backward(do, q, k, v, o, lse, cu, L, scale, **kw))
                    row["ours"][key] = {"fwd_bwd_us": t_fb, "bwd_us": t_b, "deterministic": det, "rel_l2_dq_dk_dv": rel}
                except Exception as e:  # noqa: BLE001 -- a failing config is the finding
                    row["ours"][key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                del g1, g2
        rows.append(row)
        del q, k, v, do, qs, ks, vs, dos, ref
        torch.cuda.empty_cache()
    rec = {"schema": "areal-tik-attn-bwd-probe/1", "argv": list(argv or []), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "env": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__},
           "impl_hashes": {os.path.basename(p.rstrip("/")): loader.compute_source_hash(p)[:12] for p in impls},
           "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attn_bwd_probe.json"), "w") as f:
        json.dump(rec, f, indent=1)
    for r in rows:
        cud = r["baselines"].get("cudnn")
        for key, o in r["ours"].items():
            if "error" in o:
                print(f"{r['cell']:>8} {key:<60} ERROR {o['error'][:100]}")
                continue
            ratio = (cud / o["fwd_bwd_us"]) if cud else float("nan")
            rel = "-" if o["rel_l2_dq_dk_dv"] is None else ",".join(f"{x:.1e}" for x in o["rel_l2_dq_dk_dv"])
            print(f"{r['cell']:>8} {key:<60} fb {o['fwd_bwd_us']:9.1f} bwd {o['bwd_us']:9.1f} vs cuDNN {ratio:5.2f} "
                  f"det {o['deterministic']} rel {rel}")
        print(f"{r['cell']:>8} cuDNN {cud} fa2 {r['baselines'].get('fa2')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

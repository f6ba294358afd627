"""GPU check of the current implementation's attention backward, the part of the contract suite that binds it: the
gradients against fp32 autograd (the tolerance table) and the same bits on every repeat, at the suite's packed odd
lengths (17, 300, 1000, 129; 16 / 4 heads, D 128) and at b4 x L 4224 (32 / 8 heads), bf16 and fp16
(``contract.attention._check_backward``, the checks ``python -m areal_tik_plugin.contract --ops attention`` runs).
Before them one small call, timed, so that a compile failure or a hang shows as the first line of the log.

Writes ``attn_bwd_gluon_check-<impl>.json`` under ``--out`` (checks, errors, seconds) and prints one line per check
that failed and a summary last. Exit 1 when a check fails.

Usage (GPU): ``TIK_IMPLEMENTATION=tik_v18 python -m benchmarks.probes.attn_bwd_gluon_check --out $OUT``.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.probes.attn_bwd_gluon_check")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    import torch

    from areal_tik_plugin.contract import attention as CA
    from areal_tik_plugin.contract.suite import Recorder
    from areal_tik_plugin.ops import attention_varlen
    from areal_tik_plugin.runtime import loader

    impl = loader.get_implementation()
    t0 = time.time()
    lens = [130, 7]
    cu = torch.tensor([0, 130, 137], dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(137, h, 128, device="cuda", dtype=torch.bfloat16).requires_grad_() for h in (32, 8, 8))
    o = attention_varlen(q, k, v, cu, max(lens))
    grads = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    torch.cuda.synchronize()
    smoke_s = time.time() - t0
    print(f"smoke: first backward (compile included) {smoke_s:.1f} s, finite {all(bool(g.isfinite().all()) for g in grads)}",
          flush=True)
    rec = Recorder("attention")
    t1 = time.time()
    rec.run("backward", CA._check_backward, rec)
    rec.run("backward_b4_L4224", CA._check_backward, rec, (4224,) * 4, (32, 8, 128))
    out = {"schema": "areal-tik-attn-bwd-check/1", "implementation": impl.name, "source_hash": impl.source_hash,
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "smoke_s": smoke_s,
           "seconds": time.time() - t1, "checks": rec.checks, "errors": rec.errors}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"attn_bwd_gluon_check-{impl.name}.json"), "w") as f:
        json.dump(out, f, indent=1)
    bad = [c for c in rec.checks if not c["passed"]]
    for c in bad[:20]:
        print("FAIL", json.dumps(c)[:300])
    rel = {c["name"]: c.get("rel_l2") for c in rec.checks if c["name"].startswith("grad_d")}
    for name, r in rel.items():
        print(f"{name:<40} rel_l2 {r:.2e}")
    print(f"{impl.name} {impl.source_hash[:12]}: {len(rec.checks) - len(bad)} of {len(rec.checks)} checks pass, "
          f"{len(rec.errors)} errors, {out['seconds']:.0f} s")
    return 1 if bad or rec.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())

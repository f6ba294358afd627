"""PDL on/off for the decode-sized GEMM (H200 probe): each (shape, M) of gpu.gemm_sweep's SHAPES timed with
the current config, graph replay over weight copies streamed from HBM (gemm_sweep._graph_us), programmatic
dependent launch (kernels/<impl>/_rowops.py PDL) off and on, alternating 3 times, medians; bits compared.

Usage: python scripts/pdl_gemm_probe.py --out DIR [--m 1,64] [--shapes model:layer,...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--m", default="1,64")
    ap.add_argument("--shapes", default="")
    args = ap.parse_args(argv)
    from areal_tik_plugin.gpu._rowops import stream_copies
    from areal_tik_plugin.gpu.gemm_sweep import SHAPES, _graph_us
    from areal_tik_plugin.gpu.suite import bits
    from areal_tik_plugin.loader import get_implementation

    impl = get_implementation()
    gemm, ro = impl.module("gemm"), impl.module("_rowops")
    shapes = {k: v for k, v in SHAPES.items() if not args.shapes or f"{k[0]}:{k[1]}" in args.shapes.split(",")}
    rows = []
    for (model, layer), (N, K) in shapes.items():
        ws = [(torch.randn(N, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
              for _ in range(stream_copies(N * K * 2))]
        for M in (int(m) for m in args.m.split(",") if m):
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            t = {"off": [], "on": []}
            same = True
            ro.PDL = True
            ref = bits(gemm.linear(x, ws[0])).clone()
            for _ in range(3):
                for key, val in (("off", False), ("on", True)):
                    ro.PDL = val
                    same = same and bool(torch.equal(bits(gemm.linear(x, ws[0])), ref))
                    t[key].append(_graph_us([lambda w=w: gemm.linear(x, w) for w in ws]))
            ro.PDL = True
            med = {k: sorted(v)[1] for k, v in t.items()}
            rows.append({"model": model, "layer": layer, "N": N, "K": K, "M": M,
                         "config": gemm.config_for(M, N, K)["name"], "us": med, "samples": t, "same_bits": same})
            print(f"{model:<14}{layer:<8}M={M:<4} {rows[-1]['config']:<30} off {med['off']:7.2f}  on {med['on']:7.2f}"
                  f"  on/off {med['on'] / med['off']:.3f}  same bits {same}", flush=True)
        del ws
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"pdl_gemm_probe-{impl.name}-{impl.source_hash[:12]}.json"), "w") as f:
        json.dump({"implementation": impl.name, "source_hash": impl.source_hash, "time": time.time(), "rows": rows}, f,
                  indent=1)
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

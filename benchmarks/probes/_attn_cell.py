"""The training-step cell the attention host-time probes share: their command line and inputs."""

from __future__ import annotations

import argparse
import os

HQ, HKV, D = 32, 8, 128  # the Qwen3-4B attention shape


def parse(argv=None):
    """``--cell BxL`` (default 1x1152), ``--n`` steps per timed loop (50), ``--out`` (``$OUT`` or .)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--cell", default="1x1152")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    return ap.parse_args(argv)


def inputs(torch, cell: str):
    """``(L, q, k, v, do, cu_seqlens, (qg, kg, vg))`` for ``cell`` = ``BxL`` packed sequences of length L;
    ``qg, kg, vg``: copies that require grad."""
    Bn, L = (int(x) for x in cell.split("x"))
    T = Bn * L
    q, k, v, do = (torch.randn(T, h, D, device="cuda").to(torch.bfloat16) for h in (HQ, HKV, HKV, HQ))
    cu = torch.arange(0, T + 1, L, device="cuda", dtype=torch.int32)
    return L, q, k, v, do, cu, tuple(x.clone().requires_grad_() for x in (q, k, v))

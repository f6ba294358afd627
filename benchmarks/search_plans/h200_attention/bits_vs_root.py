"""Interpreter check of a candidate tree against the root, bit for bit (small shapes, CPU):
packed varlen prefill (sequences packed back to back, so masked tiles of the TMA path read the next
sequence's keys) with and without the LSE, and paged decode of the last row of each sequence.

Usage: ``TRITON_INTERPRET=1 python benchmarks/search_plans/h200_attention/bits_vs_root.py CANDIDATE_DIR
[--numerics-changed] [--fma64] [--set NAME=INT ...]``: the root is kernels/tik_v1, or the folder in
$TIK_PLAN_ROOT; ``--set`` sets an integer module constant of the candidate's attention.py first (e.g.
PREFILL_HEADS_FIRST_KV_BYTES=0 takes the other grid order at these small shapes). With the flag (a candidate that changes shared numerics on every path, e.g. the fma
shift) equality with the root is reported, not required; prefill == decode of the candidate always is.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("TIK_PLAN_ROOT") or os.path.join(HERE, "..", "..", "..", "kernels", "tik_v1")


def load(path, pkg):
    mod = types.ModuleType(pkg)
    mod.__path__ = [os.path.abspath(path)]
    sys.modules[pkg] = mod
    return importlib.import_module(f"{pkg}.attention")


def main(argv):
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from areal_tik_plugin.runtime.interp import ensure_interpreter_if_no_gpu

    ensure_interpreter_if_no_gpu()  # the project's interpreter fixes (bf16 dot / casts, numpy scalars)
    import torch

    if "--fma64" in argv[1:]:
        # the interpreter's tl.fma is a float32 multiply then add (two roundings, = the root's mul + sub);
        # the GPU's fma.rn rounds once: product and sum in float64, one rounding to float32 (the product is
        # exact in float64), so the candidate's fma numerics are what the paths must agree on
        import numpy as np
        from triton.runtime import interpreter as I

        I.InterpreterBuilder.create_fma = lambda self, x, y, z: I.TensorHandle(
            (x.data.astype(np.float64) * y.data.astype(np.float64) + z.data.astype(np.float64)).astype(np.float32),
            z.dtype.scalar)

    root, cand = load(ROOT, "_bits_root"), load(argv[0], "_bits_cand")
    sets = [a for i, a in enumerate(argv) if i > 0 and argv[i - 1] == "--set"]
    for a in sets:
        name, _, val = a.partition("=")
        if not hasattr(cand, name):
            raise SystemExit(f"--set {a}: the candidate's attention.py has no {name}")
        setattr(cand, name, int(val))
        print(f"candidate {name} = {int(val)}")
    changed = "--numerics-changed" in argv[1:]
    torch.manual_seed(0)
    Hq, Hkv, D = 4, 2, 64
    lens = [1, 17, 70, 33]
    T = sum(lens)
    cu = torch.tensor([sum(lens[:i]) for i in range(len(lens) + 1)], dtype=torch.int32)
    q = torch.randn(T, Hq, D).to(torch.bfloat16)
    k = torch.randn(T, Hkv, D).to(torch.bfloat16)
    v = torch.randn(T, Hkv, D).to(torch.bfloat16)
    sc = 1.0 / D ** 0.5
    bad = 0
    used = []
    orig = cand._tma_ok
    cand._tma_ok = lambda x: used.append(orig(x)) or orig(x)
    for lse in (False, True):
        a = root.prefill(q, k, v, cu, max(lens), sc, return_lse=lse)
        b = cand.prefill(q, k, v, cu, max(lens), sc, return_lse=lse)
        a, b = (a if lse else (a,)), (b if lse else (b,))
        for x, y in zip(a, b):
            same = torch.equal(x.view(torch.int16) if x.dtype == torch.bfloat16 else x.view(torch.int32),
                               y.view(torch.int16) if y.dtype == torch.bfloat16 else y.view(torch.int32))
            print(f"prefill lse={lse} {tuple(x.shape)} vs root: {'same bits' if same else 'DIFFERENT'}"
                  + (" (numerics changed on every path: reported only)" if changed else ""))
            bad += not same and not changed
    # decode of each sequence's last row over a token-table pool (the packed K/V as the pool)
    out_p = cand.prefill(q, k, v, cu, max(lens), sc)
    B = len(lens)
    table = torch.zeros(B, max(lens), dtype=torch.int32)
    for i, n in enumerate(lens):
        table[i, :n] = torch.arange(int(cu[i]), int(cu[i]) + n, dtype=torch.int32)
    last = (cu[1:] - 1).long()
    od = cand.decode(q[last].contiguous(), k, v, torch.tensor(lens, dtype=torch.int32), table,
                     torch.arange(B, dtype=torch.int32), sc, 1, max(lens))
    same = torch.equal(od.view(torch.int16), out_p[last].view(torch.int16))
    print(f"candidate decode == candidate prefill (last rows): {'same bits' if same else 'DIFFERENT'}")
    bad += not same
    print(f"TMA descriptor path taken: {any(used)} ({len(used)} checks)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Why a launch leaves the short host path (``_rowops.launch`` with ``FAST_LAUNCH``) for Triton's
``fn.run``: for the kernels of a few calls (GEMM pointer and TMA configurations, attention prefill and
backward, RMSNorm), every condition the short path tests, evaluated on the arguments of the real launch,
and on a cache miss the difference between the short path's key and the keys Triton cached.

Usage: ``python -m benchmarks.probes.fast_launch_probe --out DIR``. Writes ``fast_launch_probe.json``;
prints one line per kernel.
"""

from __future__ import annotations

import argparse
import json
import os


def _diff(a, b, path=""):
    """First place where two nested keys differ, as text."""
    if type(a) is not type(b):
        return f"{path}: type {type(a).__name__} vs {type(b).__name__}: {a!r:.200} vs {b!r:.200}"
    if isinstance(a, (tuple, list)):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = _diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {a!r:.300} vs {b!r:.300}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    import torch
    import triton

    from areal_tik_plugin.runtime import loader

    R = loader.current_module("_rowops")
    G = loader.current_module("gemm")
    A = loader.current_module("attention")
    N = loader.current_module("rmsnorm")
    seen = []
    orig = R._launch

    def diagnose(fn, grid, *a, **kw):
        k = orig(fn, grid, *a, **kw)  # compiles on the first call
        kw = dict(kw)
        runtime = R.knobs.runtime
        row = {"kernel": getattr(fn, "__name__", repr(fn)), "FAST_LAUNCH": R.FAST_LAUNCH, "_FAST_TRITON": R._FAST_TRITON,
               "enter_hook": R._hooked(runtime.launch_enter_hook), "exit_hook": R._hooked(runtime.launch_exit_hook),
               "enter_hook_repr": repr(runtime.launch_enter_hook)[:200], "pre_run_hooks": len(fn.pre_run_hooks)}
        kw["debug"] = kw.get("debug", fn.debug) or runtime.debug
        kw["instrumentation_mode"] = R.knobs.compilation.instrumentation_mode
        device = R.driver.active.get_current_device()
        kernel_cache, key_cache, _, _, binder = fn.device_caches[device]
        bound, spec, options = binder(*a, **kw)
        key = R.compute_cache_key(key_cache, spec, options)
        hit = kernel_cache.get(key)
        row.update(cache_entries=len(kernel_cache), hit=hit is not None,
                   has_result=hit is not None and hasattr(hit, "result"), globals_unchanged=R._globals_unchanged(fn))
        if hit is None:
            row["key_diffs"] = [_diff(key, other) for other in list(kernel_cache)[:4]]
        if not R._globals_unchanged(fn):
            row["changed_globals"] = [f"{n}: {v!r:.80} -> {g.get(n, '<missing>')!r:.80}"
                                      for (n, _), (v, g) in fn.used_global_vals.items() if g.get(n, R._MISSING) != v]
        seen.append(row)
        return k

    gen = torch.Generator(device="cuda").manual_seed(0)
    R._launch = diagnose
    try:
        for M, Nn, K in ((256, 2048, 1536), (1, 6144, 2560), (64, 1536, 8960)):
            x = torch.randn(M, K, device="cuda", generator=gen).to(torch.bfloat16)
            w = torch.randn(Nn, K, device="cuda", generator=gen).to(torch.bfloat16)
            for _ in range(2):
                G.linear(x, w)
        T, Hq, Hkv, D = 1024, 32, 8, 128
        q, do = (torch.randn(T, Hq, D, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
        k, v = (torch.randn(T, Hkv, D, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
        cu = torch.tensor([0, T], device="cuda", dtype=torch.int32)
        for _ in range(2):
            o, lse = A.prefill(q, k, v, cu, T, D ** -0.5, return_lse=True)
            A.prefill_backward(do, q, k, v, o, lse, cu, T, D ** -0.5)
        h = torch.randn(77, 2560, device="cuda", generator=gen).to(torch.bfloat16)
        wn = torch.ones(2560, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):
            N.forward(h, wn, 1e-6)
    finally:
        R._launch = orig
    torch.cuda.synchronize()
    rec = {"schema": "areal-tik-fast-launch-probe/1", "implementation": loader.get_implementation().name,
           "triton": triton.__version__, "torch": torch.__version__, "launches": seen}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fast_launch_probe.json"), "w") as f:
        json.dump(rec, f, indent=1, default=repr)
    for r in seen:
        print(f"{r['kernel']:<32} hit {int(r['hit'])} entries {r['cache_entries']} enter_hook {int(r['enter_hook'])} "
              f"exit_hook {int(r['exit_hook'])} pre_run {r['pre_run_hooks']} result {int(r['has_result'])} "
              f"globals_ok {int(r['globals_unchanged'])} {(r.get('key_diffs') or [''])[0] or ''}"
              f" {r.get('changed_globals', '')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

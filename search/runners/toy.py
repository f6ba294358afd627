"""Runner for the CPU toy implementation (``search/testdata/toy_v1``): entry points ``toy.full`` and
``toy.step`` (see that folder's ``toy.py``). Used by the search tests and as a small end-to-end demo
of the search on a machine without a GPU."""

from __future__ import annotations

import zlib

import torch


def _bf(gen, *shape):
    return torch.randn(*shape, generator=gen).to(torch.bfloat16).float()


def _dim(ctx) -> int:
    return int(ctx.model.get("dim", 16))


def compile(ctx) -> dict:
    g = torch.Generator().manual_seed(0)
    D = _dim(ctx)
    q, k, v = _bf(g, 5, D), _bf(g, 5, D), _bf(g, 5, D)
    ctx.entry("toy.full")(q, k, v)
    ctx.entry("toy.step")(q[:1], k[None], v[None], torch.tensor([5]))
    return {"modules": sorted(set(t.split(":")[0] for t in ctx.impl.manifest["entry_points"].values()))}


def bitwise_suite(ctx, suite: dict) -> None:
    name = suite["suite"]
    g = torch.Generator().manual_seed(int(suite.get("seed", 0)))
    D = _dim(ctx)
    full, step = ctx.entry("toy.full"), ctx.entry("toy.step")
    if name == "rows_vs_step":
        for L in suite["lengths"]:
            P = max(0, L - int(suite.get("answer", 17)))
            q, k, v = _bf(g, L, D), _bf(g, L, D), _bf(g, L, D)
            ref = full(q, k, v)
            pre = full(q[:P], k[:P], v[:P]) if P else ref[:0]
            ctx.rec.bitwise(f"prefix_rows[L={L}]", ref[:P], pre)
            ctxs = torch.arange(P + 1, L + 1)
            B = L - P
            out = step(q[P:], k[None].expand(B, L, D).contiguous(), v[None].expand(B, L, D).contiguous(), ctxs)
            ctx.rec.bitwise(f"step_rows[L={L}]", ref[P:], out)
    elif name == "batched_vs_single":
        B, S = int(suite["batch"]), int(suite["max_ctx"])
        lens = [int(x) for x in torch.randint(1, S + 1, (B,), generator=g)]
        q, k, v = _bf(g, B, D), _bf(g, B, S, D), _bf(g, B, S, D)
        c = torch.tensor(lens)
        batched = step(q, k, v, c)
        single = torch.cat([step(q[i:i + 1], k[i:i + 1], v[i:i + 1], c[i:i + 1]) for i in range(B)])
        ctx.rec.bitwise(f"batched_vs_single[B={B}]", batched, single)
    else:
        raise ValueError(f"toy runner: unknown bitwise suite {name!r}; expected rows_vs_step, batched_vs_single")


def _reference(q, k, v):
    s = q.double() @ k.double().T
    w = 1.0 / (1.0 + s * s)
    w = torch.tril(w)
    return (w @ v.double()) / w.sum(1, keepdim=True)


def accuracy_case(ctx, case: dict) -> None:
    if case["suite"] != "vs_fp64":
        raise ValueError(f"toy runner: unknown accuracy case {case['suite']!r}; expected vs_fp64")
    g = torch.Generator().manual_seed(int(case.get("seed", 1)))
    D = _dim(ctx)
    for L in case["lengths"]:
        q, k, v = _bf(g, L, D), _bf(g, L, D), _bf(g, L, D)
        out = ctx.entry("toy.full")(q, k, v)
        ctx.rec.close(f"full_vs_fp64[L={L}]", out, _reference(q, k, v), atol=float(case["atol"]),
                      rtol=float(case["rtol"]))


def workload(ctx, w: dict):
    g = torch.Generator().manual_seed(1234)
    D = _dim(ctx)
    sh = w["shape"]
    if w["entry"] == "toy.full":
        T = int(sh["T"])
        q, k, v = _bf(g, T, D), _bf(g, T, D), _bf(g, T, D)
        fn = ctx.entry("toy.full")
        return lambda: fn(q, k, v)
    if w["entry"] == "toy.step":
        B, S = int(sh["batch"]), int(sh["ctx"])
        q, k, v = _bf(g, B, D), _bf(g, B, S, D), _bf(g, B, S, D)
        c = torch.full((B,), S)
        fn = ctx.entry("toy.step")
        return lambda: fn(q, k, v, c)
    raise ValueError(f"toy runner: unknown entry {w['entry']!r}")


def _timed_tolerance(ctx) -> tuple[float, float]:
    acc = [c for c in ctx.spec.get("accuracy", []) if c.get("suite") == "vs_fp64"]
    return (float(acc[0]["atol"]), float(acc[0]["rtol"])) if acc else (1e-5, 1e-4)


def workload_case(ctx, w: dict, seed: int):
    """Fresh inputs of workload ``w``'s shape (a new draw per ``seed``) and a check of the output that
    the timed call produced: every row against the fp64 reference, and one row bit for bit against the
    other entry point at the same context (so a shape-specialised path must keep the contract too)."""
    g = torch.Generator().manual_seed(1_000_003 * (seed + 1) + zlib.crc32(w["name"].encode()))
    D = _dim(ctx)
    sh = w["shape"]
    atol, rtol = _timed_tolerance(ctx)
    tag = f"timed[{w['name']}][seed={seed}]"
    full, step = ctx.entry("toy.full"), ctx.entry("toy.step")
    if w["entry"] == "toy.full":
        T = int(sh["T"])
        q, k, v = _bf(g, T, D), _bf(g, T, D), _bf(g, T, D)

        def check(out):
            if not ctx.rec.close(f"{tag}:vs_fp64", out, _reference(q, k, v), atol=atol, rtol=rtol):
                return
            last = step(q[T - 1:], k[None], v[None], torch.tensor([T]))
            ctx.rec.bitwise(f"{tag}:last_row_vs_step", out[T - 1:], last)

        return (lambda: full(q, k, v)), check
    if w["entry"] == "toy.step":
        B, S = int(sh["batch"]), int(sh["ctx"])
        q, k, v = _bf(g, B, D), _bf(g, B, S, D), _bf(g, B, S, D)
        c = torch.full((B,), S)

        def check(out):
            ref = torch.stack([_reference(torch.cat([k[b, :S - 1], q[b:b + 1]]), k[b], v[b])[-1] for b in range(B)])
            if not ctx.rec.close(f"{tag}:vs_fp64", out, ref, atol=atol, rtol=rtol):
                return
            one = step(q[:1], k[:1], v[:1], c[:1])
            ctx.rec.bitwise(f"{tag}:row0_vs_single", out[:1], one)

        return (lambda: step(q, k, v, c)), check
    raise ValueError(f"toy runner: unknown entry {w['entry']!r}")

"""Runner for unified attention: the candidate's real entry points, on a GPU or the Triton interpreter.

Entry points (manifest names) and their launcher signatures (``kernels/tik_v1/attention.py``)::

    attention.prefill(q, k, v, cu_seqlens, max_seqlen, softmax_scale)                       q [T, Hq, D]
    attention.extend(q, k_pool, v_pool, cu_seqlens_q, prefix_lens, kv_indices, table_rows,
                     max_extend_len, softmax_scale, page_size)
    attention.decode(q, k_cache, v_cache, seq_lens, kv_indices, table_rows, softmax_scale, page_size,
                     max_context_len, out=None)                                             q [B, Hq, D]

Workload shapes (spec ``workloads[].shape``): prefill ``{batch, seqlen}`` (packed equal lengths; the
training forward is a prefill over prompt + answer, L + 128), decode ``{batch, ctx}`` or
``{batch, ctx_min, ctx_max, seed}`` (mixed lengths, rollout-sized batches) over a paged pool with a
token table (SGLang page size 1) of contiguous slots per request. Model dims from spec ``model``.

Bitwise suites (raw bits, ``Recorder.bitwise``): ``prefix_decode`` (prefill(p||y) rows == prefill(p)
and == one-token decodes at every answer position, paged page size 1 and P), ``extend_chunks``
(chunked extend == full rows), ``packed_vs_separate``, ``batched_decode`` (batched == single, batch
order reversed), ``graph_replay`` (CUDA graph replayed after in-place input changes == eager, decode
and prefill; skipped on CPU). Accuracy: ``varlen_vs_fp32`` against an fp32 math reference.
"""

from __future__ import annotations

import math
import random
import zlib

import torch

from areal_tik_plugin.search.runners import capture_graph

_DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _m(ctx):
    m = ctx.model
    return int(m.get("heads_q", 32)), int(m.get("heads_kv", 8)), int(m.get("head_dim", 128)), _DT[m.get("dtype", "bfloat16")]


def _dev(ctx) -> str:
    return "cuda" if ctx.device == "cuda" else "cpu"


def _rand(ctx, *shape, gen=None):
    dt = _m(ctx)[3]
    return torch.randn(*shape, device=_dev(ctx), dtype=torch.float32, generator=gen).to(dt)


def _cu(ctx, lens):
    c = [0]
    for n in lens:
        c.append(c[-1] + int(n))
    return torch.tensor(c, device=_dev(ctx), dtype=torch.int32)


def _scale(ctx) -> float:
    return _m(ctx)[2] ** -0.5


def _pool(ctx, ks, vs, page_size=1, shuffle=True, seed=0):
    """Scatter per-request K/V [L, Hkv, D] into a pool; kv_indices = token table (page size 1) or
    page table. Slot / page 0 stays reserved as in SGLang."""
    Hkv, D = ks[0].shape[1], ks[0].shape[2]
    n_pages = sum(math.ceil(k.shape[0] / page_size) for k in ks)
    ids = list(range(1, n_pages + 1))
    if shuffle:
        random.Random(seed).shuffle(ids)
    k_pool = torch.zeros((n_pages + 1) * page_size, Hkv, D, device=ks[0].device, dtype=ks[0].dtype)
    v_pool = torch.zeros_like(k_pool)
    width = max(math.ceil(k.shape[0] / page_size) for k in ks)
    table = torch.zeros(len(ks), width, dtype=torch.int32)
    it = iter(ids)
    for r, (k, v) in enumerate(zip(ks, vs)):
        L = k.shape[0]
        n = math.ceil(L / page_size)
        pages = [next(it) for _ in range(n)]
        table[r, :n] = torch.tensor(pages, dtype=torch.int32)
        slots = (torch.tensor(pages)[:, None] * page_size + torch.arange(page_size)[None, :]).reshape(-1)[:L]
        slots = slots.to(k.device)
        k_pool[slots] = k
        v_pool[slots] = v
    rows = torch.arange(len(ks), dtype=torch.int32, device=ks[0].device)
    return k_pool, v_pool, table.to(ks[0].device), rows


def _decode(ctx, q, k_pool, v_pool, seq_lens, table, rows, page_size=1, max_ctx=None, out=None):
    cap = int(max_ctx or table.shape[1] * page_size)
    return ctx.entry("attention.decode")(q, k_pool, v_pool, seq_lens, table, rows, _scale(ctx), page_size, cap,
                                         out=out)


def _prefill(ctx, q, k, v, lens):
    return ctx.entry("attention.prefill")(q, k, v, _cu(ctx, lens), max(int(x) for x in lens), _scale(ctx))


# ------------------------------------------------------------------------------------------------
# compile
# ------------------------------------------------------------------------------------------------
def compile(ctx) -> dict:
    Hq, Hkv, D, _ = _m(ctx)
    g = torch.Generator(device=_dev(ctx)).manual_seed(0)
    L = 37
    q, k, v = _rand(ctx, L, Hq, D, gen=g), _rand(ctx, L, Hkv, D, gen=g), _rand(ctx, L, Hkv, D, gen=g)
    _prefill(ctx, q, k, v, [L])
    kp, vp, table, rows = _pool(ctx, [k], [v])
    ctx.entry("attention.extend")(q[:5].contiguous(), kp, vp, _cu(ctx, [5]),
                                  torch.tensor([0], device=_dev(ctx), dtype=torch.int32), table, rows, 5, _scale(ctx), 1)
    _decode(ctx, q[L - 1:].contiguous(), kp, vp, torch.tensor([L], device=_dev(ctx), dtype=torch.int32), table, rows)
    return {"entry_points": sorted(ctx.impl.manifest["entry_points"])}


# ------------------------------------------------------------------------------------------------
# bitwise suites
# ------------------------------------------------------------------------------------------------
def bitwise_suite(ctx, suite: dict) -> None:
    name = suite["suite"]
    fn = {"prefix_decode": _prefix_decode, "extend_chunks": _extend_chunks, "packed_vs_separate": _packed,
          "batched_decode": _batched_decode, "graph_replay": _graph_replay,
          "contract_decode": _contract_decode}.get(name)
    if fn is None:
        raise ValueError(f"attention runner: unknown bitwise suite {name!r}")
    torch.manual_seed(int(suite.get("seed", 0)))
    fn(ctx, suite)


def _prefix_decode(ctx, s):
    Hq, Hkv, D, _ = _m(ctx)
    P, A = int(s["prompt"]), int(s["answer"])
    L = P + A
    q, k, v = _rand(ctx, L, Hq, D), _rand(ctx, L, Hkv, D), _rand(ctx, L, Hkv, D)
    full = _prefill(ctx, q, k, v, [L])
    pre = _prefill(ctx, q[:P].contiguous(), k[:P].contiguous(), v[:P].contiguous(), [P])
    ctx.rec.bitwise(f"prefix_rows[P={P},A={A}]", full[:P], pre)
    for ps in s.get("page_sizes", [1]):
        kp, vp, table, _ = _pool(ctx, [k], [v], page_size=int(ps))
        rows = torch.zeros(A, dtype=torch.int32, device=_dev(ctx))
        sl = torch.arange(P + 1, L + 1, dtype=torch.int32, device=_dev(ctx))
        dec = _decode(ctx, q[P:].contiguous(), kp, vp, sl, table, rows, page_size=int(ps))
        ctx.rec.bitwise(f"decode_rows[P={P},A={A},page={ps}]", full[P:], dec)


def contract_positions(contract, prefix: str = "ATTN_", max_ctx: int | None = None) -> dict[str, list[int]]:
    """Decode contexts at every boundary of the candidate's coupled integer constants (``COUPLED`` keys
    with ``prefix``, current values read from its contract): v - 1, v, v + 1 and 2 v + 1, so every tile
    and split boundary a coupled constant defines is crossed by a decode row. A new coupled constant is
    covered as soon as the contract lists it."""
    out = {}
    for name in sorted(getattr(contract, "COUPLED", {}) or {}):
        v = getattr(contract, name, None)
        if not name.startswith(prefix) or isinstance(v, bool) or not isinstance(v, int) or v < 1:
            continue
        ps = sorted({p for p in (v - 1, v, v + 1, 2 * v + 1) if p >= 1 and (max_ctx is None or p <= max_ctx)})
        if ps:
            out[f"{name}={v}"] = ps
    return out


def _contract_decode(ctx, s):
    """prefill(x) row p-1 == one-token decode at context p, for every p of :func:`contract_positions`."""
    Hq, Hkv, D, _ = _m(ctx)
    per = contract_positions(ctx.impl.contract, s.get("prefix", "ATTN_"), s.get("max_ctx"))
    if not per:
        raise ValueError(f"contract_decode: the contract has no coupled integer constant starting with "
                         f"{s.get('prefix', 'ATTN_')!r}")
    pos = sorted({p for ps in per.values() for p in ps})
    L = max(pos)
    q, k, v = _rand(ctx, L, Hq, D), _rand(ctx, L, Hkv, D), _rand(ctx, L, Hkv, D)
    full = _prefill(ctx, q, k, v, [L])
    idx = torch.tensor([p - 1 for p in pos], device=_dev(ctx))
    for ps in s.get("page_sizes", [1]):
        kp, vp, table, _ = _pool(ctx, [k], [v], page_size=int(ps))
        rows = torch.zeros(len(pos), dtype=torch.int32, device=_dev(ctx))
        sl = torch.tensor(pos, dtype=torch.int32, device=_dev(ctx))
        dec = _decode(ctx, q[idx].contiguous(), kp, vp, sl, table, rows, page_size=int(ps))
        ctx.rec.bitwise(f"contract_decode[{','.join(per)};ctx={pos};page={ps}]", full[idx], dec)


def _extend_chunks(ctx, s):
    Hq, Hkv, D, _ = _m(ctx)
    L = int(s["length"])
    q, k, v = _rand(ctx, L, Hq, D), _rand(ctx, L, Hkv, D), _rand(ctx, L, Hkv, D)
    full = _prefill(ctx, q, k, v, [L])
    kp, vp, table, rows = _pool(ctx, [k], [v])
    rng = random.Random(int(s.get("seed", 0)))
    for spec_chunks in s["chunks"]:
        chunks = []
        left = L
        while left > 0:
            c = rng.randint(1, int(spec_chunks[4:])) if isinstance(spec_chunks, str) and spec_chunks.startswith("rand") \
                else int(spec_chunks)
            c = min(c, left)
            chunks.append(c)
            left -= c
        outs, pos = [], 0
        for c in chunks:
            outs.append(ctx.entry("attention.extend")(
                q[pos:pos + c].contiguous(), kp, vp, _cu(ctx, [c]),
                torch.tensor([pos], device=_dev(ctx), dtype=torch.int32), table, rows, c, _scale(ctx), 1))
            pos += c
        ctx.rec.bitwise(f"extend_chunks[L={L},{spec_chunks}]", torch.cat(outs), full, n_chunks=len(chunks))


def _packed(ctx, s):
    Hq, Hkv, D, _ = _m(ctx)
    lens = [int(x) for x in s["lens"]]
    T = sum(lens)
    q, k, v = _rand(ctx, T, Hq, D), _rand(ctx, T, Hkv, D), _rand(ctx, T, Hkv, D)
    packed = _prefill(ctx, q, k, v, lens)
    outs, p = [], 0
    for n in lens:
        outs.append(_prefill(ctx, q[p:p + n].contiguous(), k[p:p + n].contiguous(), v[p:p + n].contiguous(), [n]))
        p += n
    ctx.rec.bitwise(f"packed_vs_separate[{len(lens)} seqs]", packed, torch.cat(outs))


def _mixed_lens(B, lo, hi, seed):
    rng = random.Random(seed)
    lens = [rng.randint(lo, hi) for _ in range(B)]
    if B >= 2:
        lens[0], lens[1] = lo, hi
    return lens


def _batched_decode(ctx, s):
    Hq, Hkv, D, _ = _m(ctx)
    B = int(s["batch"])
    lens = _mixed_lens(B, int(s.get("ctx_min", 1)), int(s["ctx_max"]), int(s.get("seed", 0)))
    ks = [_rand(ctx, n, Hkv, D) for n in lens]
    vs = [_rand(ctx, n, Hkv, D) for n in lens]
    kp, vp, table, rows = _pool(ctx, ks, vs)
    q = _rand(ctx, B, Hq, D)
    sl = torch.tensor(lens, dtype=torch.int32, device=_dev(ctx))
    batched = _decode(ctx, q, kp, vp, sl, table, rows)
    single = torch.cat([_decode(ctx, q[i:i + 1].contiguous(), kp, vp, sl[i:i + 1], table, rows[i:i + 1])
                        for i in range(B)])
    ctx.rec.bitwise(f"batched_vs_single_decode[B={B}]", batched, single)
    perm = torch.arange(B - 1, -1, -1, device=_dev(ctx))
    rev = _decode(ctx, q[perm].contiguous(), kp, vp, sl[perm].contiguous(), table, rows[perm].contiguous())
    ctx.rec.bitwise(f"batch_order_decode[B={B}]", rev[perm.argsort()], batched)


def _graph_replay(ctx, s):
    if ctx.device != "cuda":
        ctx.rec.check("graph_replay", True, kind="bitwise", skipped="no CUDA graphs on the CPU")
        return
    Hq, Hkv, D, _ = _m(ctx)
    B = int(s.get("batch", 16))
    hi = int(s.get("ctx_max", 4096))
    lens = _mixed_lens(B, 64, hi, int(s.get("seed", 1)))
    ks = [_rand(ctx, n + 64, Hkv, D) for n in lens]
    vs = [_rand(ctx, n + 64, Hkv, D) for n in lens]
    kp, vp, table, rows = _pool(ctx, ks, vs)
    q = _rand(ctx, B, Hq, D)
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    cap = table.shape[1]

    def step():
        _decode(ctx, q, kp, vp, sl, table, rows, max_ctx=cap, out=out)

    g = capture_graph(step)
    rng = random.Random(7)
    for it in range(int(s.get("replays", 3))):
        q.copy_(_rand(ctx, B, Hq, D))
        sl.copy_(torch.tensor([n + rng.randint(0, 64) for n in lens], dtype=torch.int32, device="cuda"))
        g.replay()
        torch.cuda.synchronize()
        eager = _decode(ctx, q, kp, vp, sl, table, rows, max_ctx=cap)
        ctx.rec.bitwise(f"graph_replay_vs_eager_decode[{it}]", out.clone(), eager)
    # prefill: fixed shapes, new contents
    L = int(s.get("prefill_len", 1000))
    pq, pk, pv = _rand(ctx, L, Hq, D), _rand(ctx, L, Hkv, D), _rand(ctx, L, Hkv, D)
    cu = _cu(ctx, [L])
    holder = {}

    def pstep():
        holder["o"] = ctx.entry("attention.prefill")(pq, pk, pv, cu, L, _scale(ctx))

    g2 = capture_graph(pstep)
    for it in range(2):
        pq.copy_(_rand(ctx, L, Hq, D))
        pk.copy_(_rand(ctx, L, Hkv, D))
        pv.copy_(_rand(ctx, L, Hkv, D))
        g2.replay()
        torch.cuda.synchronize()
        eager = ctx.entry("attention.prefill")(pq, pk, pv, cu, L, _scale(ctx))
        ctx.rec.bitwise(f"graph_replay_vs_eager_prefill[{it}]", holder["o"].clone(), eager)


# ------------------------------------------------------------------------------------------------
# accuracy
# ------------------------------------------------------------------------------------------------
def _reference(q, k, v, lens, scale):
    outs, p = [], 0
    g = q.shape[1] // k.shape[1]
    for n in lens:
        qq = q[p:p + n].float().transpose(0, 1)
        kk = k[p:p + n].float().repeat_interleave(g, 1).transpose(0, 1)
        vv = v[p:p + n].float().repeat_interleave(g, 1).transpose(0, 1)
        s = (qq @ kk.transpose(1, 2)) * scale
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
        outs.append((torch.softmax(s, -1) @ vv).transpose(0, 1))
        p += n
    return torch.cat(outs)


def accuracy_case(ctx, case: dict) -> None:
    if case["suite"] != "varlen_vs_fp32":
        raise ValueError(f"attention runner: unknown accuracy case {case['suite']!r}")
    Hq, Hkv, D, _ = _m(ctx)
    torch.manual_seed(int(case.get("seed", 3)))
    lens = [int(x) for x in case["lens"]]
    T = sum(lens)
    q, k, v = _rand(ctx, T, Hq, D), _rand(ctx, T, Hkv, D), _rand(ctx, T, Hkv, D)
    out = _prefill(ctx, q, k, v, lens)
    ref = _reference(q, k, v, lens, _scale(ctx))
    ctx.rec.close(f"varlen_vs_fp32[{lens}]", out, ref, atol=float(case["atol"]), rtol=float(case["rtol"]))


# ------------------------------------------------------------------------------------------------
# workloads
# ------------------------------------------------------------------------------------------------
def _build(ctx, w: dict, seed: int | None = None):
    """Inputs of workload ``w`` (seeded by its name, plus ``seed`` for a fresh draw) -> (call, reference)
    where ``reference(out)`` yields (rows of out, fp32 reference rows) for a sample of requests."""
    Hq, Hkv, D, _ = _m(ctx)
    sh = w["shape"]
    torch.manual_seed(zlib.crc32(w["name"].encode()) + (0 if seed is None else 7919 * (seed + 1)))
    scale = _scale(ctx)
    if w["entry"] in ("attention.prefill",):
        B, L = int(sh["batch"]), int(sh["seqlen"])
        q, k, v = _rand(ctx, B * L, Hq, D), _rand(ctx, B * L, Hkv, D), _rand(ctx, B * L, Hkv, D)
        cu = _cu(ctx, [L] * B)
        f = ctx.entry("attention.prefill")

        def ref(out):
            rs = sorted({0, B - 1})
            return (torch.cat([out[r * L:(r + 1) * L] for r in rs]),
                    torch.cat([_reference(q[r * L:(r + 1) * L], k[r * L:(r + 1) * L], v[r * L:(r + 1) * L], [L], scale)
                               for r in rs]))

        return (lambda: f(q, k, v, cu, L, scale)), ref
    if w["entry"] == "attention.decode":
        B = int(sh["batch"])
        if "ctx" in sh:
            lens = [int(sh["ctx"])] * B
        else:
            lens = _mixed_lens(B, int(sh["ctx_min"]), int(sh["ctx_max"]), int(sh.get("seed", 0)))
        total = sum(lens)
        # contiguous slots per request (fresh allocation), slot 0 reserved
        k_pool = _rand(ctx, total + 1, Hkv, D)
        v_pool = _rand(ctx, total + 1, Hkv, D)
        width = max(lens)
        table = torch.zeros(B, width, dtype=torch.int32, device=_dev(ctx))
        p = 1
        for r, n in enumerate(lens):
            table[r, :n] = torch.arange(p, p + n, dtype=torch.int32, device=_dev(ctx))
            p += n
        rows = torch.arange(B, dtype=torch.int32, device=_dev(ctx))
        sl = torch.tensor(lens, dtype=torch.int32, device=_dev(ctx))
        q = _rand(ctx, B, Hq, D)
        out = torch.empty_like(q)
        f = ctx.entry("attention.decode")

        def ref(o):
            rs = sorted({0, B // 2, B - 1})
            refs = []
            for r in rs:
                n = lens[r]
                idx = table[r, :n].long()
                qq = torch.zeros(n, Hq, D, device=q.device, dtype=q.dtype)
                qq[-1] = q[r]
                refs.append(_reference(qq, k_pool[idx], v_pool[idx], [n], scale)[-1:])
            return torch.cat([o[r:r + 1] for r in rs]), torch.cat(refs)

        return (lambda: f(q, k_pool, v_pool, sl, table, rows, scale, 1, width, out=out)), ref
    if w["entry"] == "attention.extend":
        B, P, C = int(sh["batch"]), int(sh["prefix"]), int(sh["chunk"])
        L = P + C
        k_pool = _rand(ctx, B * L + 1, Hkv, D)
        v_pool = _rand(ctx, B * L + 1, Hkv, D)
        table = (torch.arange(B * L, dtype=torch.int32, device=_dev(ctx)).view(B, L) + 1).contiguous()
        rows = torch.arange(B, dtype=torch.int32, device=_dev(ctx))
        q = _rand(ctx, B * C, Hq, D)
        cu = _cu(ctx, [C] * B)
        pre = torch.full((B,), P, dtype=torch.int32, device=_dev(ctx))
        f = ctx.entry("attention.extend")

        def ref(o):
            rs = sorted({0, B - 1})
            refs = []
            for r in rs:
                idx = table[r].long()
                qq = torch.zeros(L, Hq, D, device=q.device, dtype=q.dtype)
                qq[P:] = q[r * C:(r + 1) * C]
                refs.append(_reference(qq, k_pool[idx], v_pool[idx], [L], scale)[P:])
            return torch.cat([o[r * C:(r + 1) * C] for r in rs]), torch.cat(refs)

        return (lambda: f(q, k_pool, v_pool, cu, pre, table, rows, C, scale, 1)), ref
    raise ValueError(f"attention runner: unknown entry {w['entry']!r}")


def workload(ctx, w: dict):
    return _build(ctx, w)[0]


def workload_case(ctx, w: dict, seed: int):
    """Fresh inputs of ``w``'s shape per ``seed`` and a check of the timed call's output: sampled
    requests (first, middle, last) against the fp32 math reference under the spec's accuracy tolerance."""
    call, ref = _build(ctx, w, seed)
    acc = [c for c in ctx.spec.get("accuracy", []) if c.get("suite") == "varlen_vs_fp32"]
    atol, rtol = (float(acc[0]["atol"]), float(acc[0]["rtol"])) if acc else (0.02, 0.02)

    def check(out):
        got, want = ref(out)
        ctx.rec.close(f"timed[{w['name']}][seed={seed}]:vs_fp32", got, want, atol=atol, rtol=rtol)

    return call, check

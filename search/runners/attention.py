"""Runner for unified attention: the candidate's real entry points, on a GPU or the Triton interpreter.

Entry points (manifest names) and their launcher signatures (``kernels/tik_v1/attention.py``)::

    attention.prefill(q, k, v, cu_seqlens, max_seqlen, softmax_scale)                       q [T, Hq, D]
    attention.extend(q, k_pool, v_pool, cu_seqlens_q, prefix_lens, kv_indices, table_rows,
                     max_extend_len, softmax_scale, page_size)
    attention.decode(q, k_cache, v_cache, seq_lens, kv_indices, table_rows, softmax_scale, page_size,
                     max_context_len, out=None)                                             q [B, Hq, D]
    attention.prefill_backward(do, q, k, v, o, lse, cu_seqlens, max_seqlen, softmax_scale) -> (dq, dk, dv)

Workload shapes (spec ``workloads[].shape``): prefill ``{batch, seqlen}`` (packed equal lengths; the
training forward is a prefill over prompt + answer, L + 128), decode ``{batch, ctx}`` or
``{batch, ctx_min, ctx_max, seed}`` (mixed lengths, rollout-sized batches) over a paged pool with a
token table (SGLang page size 1) of contiguous slots per request, training step (entry
``attention.prefill_backward``, kind ``train_fwd_bwd``) ``{batch, seqlen}`` or ``{lens: [...]}`` (packed
sequences of those lengths): one timed call is ``prefill(..., return_lse=True)`` then
``prefill_backward``, as the autograd function of ``areal_tik_plugin.ops.attention`` runs them. Model
dims from spec ``model``. :func:`check_spec` refuses a spec this runner cannot run before a run exists.

Bitwise suites (raw bits, ``Recorder.bitwise``): ``prefix_decode`` (prefill(p||y) rows == prefill(p)
and == one-token decodes at every answer position, paged page size 1 and P), ``extend_chunks``
(chunked extend == full rows), ``packed_vs_separate``, ``batched_decode`` (batched == single, batch
order reversed), ``graph_replay`` (CUDA graph replayed after in-place input changes == eager, decode
and prefill; skipped on CPU), ``train_determinism`` (the training step repeated on the same inputs gives
the same o / dq / dk / dv bits, and its o equals the rollout prefill's bits: Constraint (1) holds for the
forward the trainer runs). Accuracy: ``varlen_vs_fp32`` (forward) and ``train_vs_fp32`` (o, and dq / dk /
dv as relative L2 error, the gradient tolerance of ``areal_tik_plugin.contract.attention``) against fp32
math attention differentiated by autograd.
"""

from __future__ import annotations

import math
import random
import zlib

import torch

from areal_tik_plugin.search.runners import capture_graph

_DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TRAIN = "attention.prefill_backward"
# entry point -> the spec's entry kind for it, and the shape keys a workload of it needs (one set of the tuple)
ENTRY_KINDS = {"attention.prefill": "full_sequence", "attention.extend": "full_sequence",
               "attention.decode": "decode", TRAIN: "train_fwd_bwd"}
SHAPE_KEYS = {"attention.prefill": (("batch", "seqlen"),), "attention.extend": (("batch", "prefix", "chunk"),),
              "attention.decode": (("batch", "ctx"), ("batch", "ctx_min", "ctx_max")),
              TRAIN: (("batch", "seqlen"), ("lens",))}
BITWISE_SUITES = ("prefix_decode", "extend_chunks", "packed_vs_separate", "batched_decode", "graph_replay",
                  "contract_decode", "train_determinism")
ACCURACY_SUITES = ("varlen_vs_fp32", "train_vs_fp32")
# relative L2 error of dq / dk / dv vs fp32 autograd: the gradient tolerance of the contract suite
# (areal_tik_plugin.contract.attention._check_backward); fp32 inputs leave only accumulation order
GRAD_TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


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


def _train_step(ctx, q, k, v, do, cu, max_len):
    """The training step of one layer's attention: forward keeping the log-sum-exp, then the backward
    from it (the two calls of ``ops.attention._AttnVarlen``). Returns (o, dq, dk, dv)."""
    o, lse = ctx.entry("attention.prefill")(q, k, v, cu, max_len, _scale(ctx), return_lse=True)
    dq, dk, dv = ctx.entry(TRAIN)(do, q, k, v, o, lse, cu, max_len, _scale(ctx))
    return o, dq, dk, dv


def _train_lens(sh: dict) -> list[int]:
    if "lens" in sh:
        return [int(x) for x in sh["lens"]]
    return [int(sh["seqlen"])] * int(sh["batch"])


# ------------------------------------------------------------------------------------------------
# spec checks (parent side, before a run directory or a worker exists)
# ------------------------------------------------------------------------------------------------
def _positive_ints(x) -> bool:
    xs = x if isinstance(x, list) else [x]
    return bool(xs) and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in xs)


def check_spec(spec: dict) -> None:
    """Refuse, naming what was expected, a spec whose entry points, workload shapes or suites this runner
    cannot run (otherwise the root's audit would fail in its worker with a less direct message)."""
    for ep, kind in spec["entry_points"].items():
        if ep not in ENTRY_KINDS:
            raise ValueError(f"entry_points.{ep}: the attention runner knows the entries {sorted(ENTRY_KINDS)}")
        if kind != ENTRY_KINDS[ep]:
            raise ValueError(f"entry_points.{ep}: expected the kind {ENTRY_KINDS[ep]!r}, got {kind!r}")
    for i, w in enumerate(spec["workloads"]):
        where = f"workloads[{i}] ({w['name']})"
        sh, need = w["shape"], SHAPE_KEYS[w["entry"]]
        keys = next((ks for ks in need if all(k in sh for k in ks)), None)
        if keys is None:
            raise ValueError(f"{where}.shape: {w['entry']} expects the keys "
                             f"{' or '.join('{' + ', '.join(ks) + '}' for ks in need)}, got {sorted(sh)}")
        for key in keys:
            if not _positive_ints(sh[key]):
                raise ValueError(f"{where}.shape.{key}: expected a positive integer"
                                 f"{' list' if key == 'lens' else ''}, got {sh[key]!r}")
    for key, names in (("bitwise", BITWISE_SUITES), ("accuracy", ACCURACY_SUITES)):
        for i, it in enumerate(spec.get(key, [])):
            if it["suite"] not in names:
                raise ValueError(f"{key}[{i}].suite: {it['suite']!r}; the attention runner has {list(names)}")
    needs_train = any(it["suite"] in ("train_determinism", "train_vs_fp32")
                      for it in spec.get("bitwise", []) + spec.get("accuracy", []))
    if needs_train and TRAIN not in spec["entry_points"]:
        raise ValueError(f"the train_* suites call {TRAIN}: expected it in entry_points "
                         f"(kind {ENTRY_KINDS[TRAIN]!r})")


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
    if TRAIN in ctx.spec["entry_points"]:
        _train_step(ctx, q, k, v, _rand(ctx, L, Hq, D, gen=g), _cu(ctx, [L]), L)
    return {"entry_points": sorted(ctx.impl.manifest["entry_points"])}


# ------------------------------------------------------------------------------------------------
# bitwise suites
# ------------------------------------------------------------------------------------------------
def bitwise_suite(ctx, suite: dict) -> None:
    name = suite["suite"]
    fn = {"prefix_decode": _prefix_decode, "extend_chunks": _extend_chunks, "packed_vs_separate": _packed,
          "batched_decode": _batched_decode, "graph_replay": _graph_replay,
          "contract_decode": _contract_decode, "train_determinism": _train_determinism}.get(name)
    if fn is None:
        raise ValueError(f"attention runner: unknown bitwise suite {name!r}; expected one of {list(BITWISE_SUITES)}")
    torch.manual_seed(int(suite.get("seed", 0)))
    fn(ctx, suite)


def _train_bits(ctx, tag, q, k, v, do, lens, first, repeats: int) -> None:
    """``first`` (o, dq, dk, dv) of a training step == ``repeats`` more calls on the same inputs, bit for bit,
    and its o == the rollout prefill's o (the trainer's forward is the path Constraint (1) compares)."""
    cu, mx = _cu(ctx, lens), max(lens)
    for r in range(repeats):
        again = _train_step(ctx, q, k, v, do, cu, mx)
        for name, a, b in zip(("o", "dq", "dk", "dv"), again, first):
            ctx.rec.bitwise(f"{tag}:repeat[{r}]:{name}", a, b)
    ctx.rec.bitwise(f"{tag}:o_vs_prefill", first[0], _prefill(ctx, q, k, v, lens))


def _train_inputs(ctx, T):
    """q, k, v and the output gradient dO of a T-token training step, in this order from the generator."""
    Hq, Hkv, D, _ = _m(ctx)
    return _rand(ctx, T, Hq, D), _rand(ctx, T, Hkv, D), _rand(ctx, T, Hkv, D), _rand(ctx, T, Hq, D)


def _train_determinism(ctx, s):
    lens = [int(x) for x in s["lens"]]
    T = sum(lens)
    q, k, v, do = _train_inputs(ctx, T)
    first = _train_step(ctx, q, k, v, do, _cu(ctx, lens), max(lens))
    _train_bits(ctx, f"train_determinism[{lens}]", q, k, v, do, lens, first, int(s.get("repeats", 2)))


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


def _reference_train(q, k, v, do, lens, scale, kv_heads=None):
    """fp32 math attention (causal, per packed sequence) and its autograd gradients for ``do``, one query head
    at a time (O(n^2) memory per head, so a 16K sequence fits), for the kv heads ``kv_heads`` (default all)
    and their query heads. Returns o, dq [T, len(kv_heads) * group, D] and dk, dv [T, len(kv_heads), D]."""
    T, Hq, D = q.shape
    g = Hq // k.shape[1]
    kvh = list(range(k.shape[1])) if kv_heads is None else list(kv_heads)
    o = torch.empty(T, len(kvh) * g, D, device=q.device, dtype=torch.float32)
    dq = torch.empty_like(o)
    dk = torch.zeros(T, len(kvh), D, device=q.device, dtype=torch.float32)
    dv = torch.zeros_like(dk)
    p = 0
    with torch.enable_grad():
        for n in lens:
            sl = slice(p, p + n)
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            for jj, j in enumerate(kvh):
                kk = k[sl, j].float().requires_grad_()
                vv = v[sl, j].float().requires_grad_()
                for i in range(g):
                    qq = q[sl, j * g + i].float().requires_grad_()
                    s = ((qq @ kk.T) * scale).masked_fill(~mask, float("-inf"))
                    oo = torch.softmax(s, -1) @ vv
                    gq, gk, gv = torch.autograd.grad(oo, (qq, kk, vv), do[sl, j * g + i].float())
                    o[sl, jj * g + i] = oo.detach()
                    dq[sl, jj * g + i] = gq
                    dk[sl, jj] += gk
                    dv[sl, jj] += gv
            p += n
    return o, dq, dk, dv


def _check_train(ctx, tag, got, want, *, atol, rtol, grad_tol) -> None:
    """o elementwise under the forward tolerance; dq / dk / dv by relative L2 error (kind accuracy)."""
    ctx.rec.close(f"{tag}:o", got[0], want[0], atol=atol, rtol=rtol)
    for name, a, b in zip(("dq", "dk", "dv"), got[1:], want[1:]):
        a64, b64 = a.double(), b.double()
        finite = bool(torch.isfinite(a64).all())
        rel = float((a64 - b64).norm() / b64.norm().clamp_min(1e-30))
        ctx.rec.check(f"{tag}:{name}", finite and rel <= grad_tol, kind="accuracy", rel_l2=rel, tol_rel_l2=grad_tol,
                      finite=finite, max_abs=float((a64 - b64).abs().max()))


def _train_tolerance(ctx, case: dict | None = None) -> tuple[float, float, float]:
    """(atol, rtol) of o and the relative L2 bound of the gradients: from ``case`` (or the spec's
    ``train_vs_fp32`` case, then its ``varlen_vs_fp32`` case), else the tables."""
    acc = ctx.spec.get("accuracy", [])
    case = case or next((c for c in acc if c.get("suite") == "train_vs_fp32"), None) \
        or next((c for c in acc if c.get("suite") == "varlen_vs_fp32"), None) or {}
    return (float(case.get("atol", 0.02)), float(case.get("rtol", 0.02)),
            float(case.get("grad_rel_l2", GRAD_TOL.get(_m(ctx)[3], 2e-2))))


def _train_vs_fp32(ctx, case):
    lens = [int(x) for x in case["lens"]]
    T = sum(lens)
    q, k, v, do = _train_inputs(ctx, T)
    got = _train_step(ctx, q, k, v, do, _cu(ctx, lens), max(lens))
    atol, rtol, gtol = _train_tolerance(ctx, case)
    _check_train(ctx, f"train_vs_fp32[{lens}]", got, _reference_train(q, k, v, do, lens, _scale(ctx)),
                 atol=atol, rtol=rtol, grad_tol=gtol)


def accuracy_case(ctx, case: dict) -> None:
    if case["suite"] not in ACCURACY_SUITES:
        raise ValueError(f"attention runner: unknown accuracy case {case['suite']!r}; expected one of "
                         f"{list(ACCURACY_SUITES)}")
    if case["suite"] == "train_vs_fp32":
        torch.manual_seed(int(case.get("seed", 5)))
        return _train_vs_fp32(ctx, case)
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
    raise ValueError(f"attention runner: unknown entry {w['entry']!r}; expected one of {sorted(ENTRY_KINDS)}")


def _build_train(ctx, w: dict, seed: int | None = None):
    """Inputs of a training-step workload -> (call, check). ``check(out)`` repeats the call on the same
    inputs (bits of o / dq / dk / dv must not change: a nondeterministic backward, e.g. by atomics in an
    order that varies, is a contract violation), compares o with the rollout prefill's bits, and checks
    the first and last sequence on the first and last kv head (and their query heads) against fp32
    autograd."""
    Hq, Hkv, D, _ = _m(ctx)
    lens = _train_lens(w["shape"])
    torch.manual_seed(zlib.crc32(w["name"].encode()) + (0 if seed is None else 7919 * (seed + 1)))
    T = sum(lens)
    q, k, v, do = _train_inputs(ctx, T)
    cu, mx = _cu(ctx, lens), max(lens)
    atol, rtol, gtol = _train_tolerance(ctx)
    tag = f"timed[{w['name']}][seed={seed}]"

    def call():
        return _train_step(ctx, q, k, v, do, cu, mx)

    def check(out):
        _train_bits(ctx, f"{tag}:train", q, k, v, do, lens, out, 1)
        starts = [0]
        for n in lens:
            starts.append(starts[-1] + n)
        heads = sorted({0, Hkv - 1})
        qh = torch.tensor([j * (Hq // Hkv) + i for j in heads for i in range(Hq // Hkv)], device=q.device)
        kh = torch.tensor(heads, device=q.device)
        for r in sorted({0, len(lens) - 1}):
            sl = slice(starts[r], starts[r + 1])
            want = _reference_train(q[sl], k[sl], v[sl], do[sl], [lens[r]], _scale(ctx), heads)
            got = (out[0][sl][:, qh], out[1][sl][:, qh], out[2][sl][:, kh], out[3][sl][:, kh])
            _check_train(ctx, f"{tag}:seq{r}:vs_fp32", got, want, atol=atol, rtol=rtol, grad_tol=gtol)

    return call, check


def workload(ctx, w: dict):
    if w["entry"] == TRAIN:
        return _build_train(ctx, w)[0]
    return _build(ctx, w)[0]


def workload_case(ctx, w: dict, seed: int):
    """Fresh inputs of ``w``'s shape per ``seed`` and a check of the timed call's output: sampled
    requests (first, middle, last) against the fp32 math reference under the spec's accuracy tolerance
    (training step: :func:`_build_train`)."""
    if w["entry"] == TRAIN:
        return _build_train(ctx, w, seed)
    call, ref = _build(ctx, w, seed)
    acc = [c for c in ctx.spec.get("accuracy", []) if c.get("suite") == "varlen_vs_fp32"]
    atol, rtol = (float(acc[0]["atol"]), float(acc[0]["rtol"])) if acc else (0.02, 0.02)

    def check(out):
        got, want = ref(out)
        ctx.rec.close(f"timed[{w['name']}][seed={seed}]:vs_fp32", got, want, atol=atol, rtol=rtol)

    return call, check

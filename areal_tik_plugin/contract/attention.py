"""GPU contract suite and benchmarks for unified attention (H200 sizes)."""

from __future__ import annotations

import math
import random

import torch
import torch.nn.functional as F

from areal_tik_plugin import bench
from areal_tik_plugin.contract import baselines as B
from areal_tik_plugin.contract.suite import timed as _time
from areal_tik_plugin.ops import attention_decode, attention_extend, attention_varlen

DEV = "cuda"


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEV, dtype=dtype)


def _cu(lens):
    c = [0]
    for n in lens:
        c.append(c[-1] + n)
    return torch.tensor(c, device=DEV, dtype=torch.int32)


def _pool_from_seqs(ks, vs, page_size=1, n_spare=64, seed=0):
    """Scatter per-sequence K/V [L, Hkv, D] into a pool with a random slot/page permutation.

    Returns k_pool, v_pool, kv_indices (token table for page 1, page table otherwise), rows.
    Slot 0 (page 0) stays reserved, as in SGLang.
    """
    g = torch.Generator(device="cpu").manual_seed(seed)
    Hkv, D = ks[0].shape[1], ks[0].shape[2]
    width_tok = max(k.shape[0] for k in ks)
    n_pages = sum(math.ceil(k.shape[0] / page_size) for k in ks) + n_spare
    perm = (torch.randperm(n_pages, generator=g) + 1).tolist()  # page ids >= 1
    k_pool = _rand(n_pages * page_size + page_size, Hkv, D, dtype=ks[0].dtype)
    v_pool = _rand(n_pages * page_size + page_size, Hkv, D, dtype=ks[0].dtype)
    width = math.ceil(width_tok / page_size)
    table = torch.zeros(len(ks), width, dtype=torch.int32)
    it = iter(perm)
    for r, (k, v) in enumerate(zip(ks, vs)):
        L = k.shape[0]
        for p in range(math.ceil(L / page_size)):
            pid = next(it)
            table[r, p] = pid
            lo, hi = p * page_size, min(L, (p + 1) * page_size)
            k_pool[pid * page_size: pid * page_size + hi - lo] = k[lo:hi]
            v_pool[pid * page_size: pid * page_size + hi - lo] = v[lo:hi]
    if page_size == 1:
        table = table  # token-level table == page table with page 1
    rows = torch.arange(len(ks), dtype=torch.int32, device=DEV)
    return k_pool, v_pool, table.to(DEV), rows


# ------------------------------------------------------------------------------------------------
# contract checks
# ------------------------------------------------------------------------------------------------
def _check_prefix_and_decode(rec, Hq, Hkv, D, dtype, prompt, answer, page_size, tag):
    L = prompt + answer
    q, k, v = _rand(L, Hq, D, dtype=dtype), _rand(L, Hkv, D, dtype=dtype), _rand(L, Hkv, D, dtype=dtype)
    full = attention_varlen(q, k, v, _cu([L]), L)
    pre = attention_varlen(q[:prompt].contiguous(), k[:prompt].contiguous(), v[:prompt].contiguous(), _cu([prompt]), prompt)
    rec.bitwise(f"prefix_rows[{tag}]", full[:prompt], pre, prompt=prompt, answer=answer)
    # every answer row == decode at that context: one decode batch with one request per position
    k_pool, v_pool, table, _ = _pool_from_seqs([k], [v], page_size=page_size)
    B = answer
    rows = torch.zeros(B, dtype=torch.int32, device=DEV)
    seq_lens = torch.arange(prompt + 1, L + 1, dtype=torch.int32, device=DEV)
    dec = attention_decode(q[prompt:].contiguous(), k_pool, v_pool, seq_lens=seq_lens, kv_indices=table,
                           table_rows=rows, page_size=page_size)
    rec.bitwise(f"decode_rows[{tag}]", full[prompt:], dec, prompt=prompt, answer=answer, page_size=page_size)
    # dense cache decode == paged decode
    kd = k.unsqueeze(0).expand(B, L, Hkv, D).contiguous() if B * L * Hkv * D < 2**31 else None
    if kd is not None:
        vd = v.unsqueeze(0).expand(B, L, Hkv, D).contiguous()
        dd = attention_decode(q[prompt:].contiguous(), kd, vd, seq_lens=seq_lens)
        rec.bitwise(f"dense_vs_paged_decode[{tag}]", dd, dec)
    return q, k, v, full


def _check_extend_chunks(rec, q, k, v, full, chunks, page_size, tag):
    L = q.shape[0]
    k_pool, v_pool, table, rows = _pool_from_seqs([k], [v], page_size=page_size)
    outs = []
    pos = 0
    for c in chunks:
        c = min(c, L - pos)
        if c <= 0:
            break
        o = attention_extend(q[pos:pos + c].contiguous(), k_pool, v_pool, cu_seqlens_q=_cu([c]),
                             prefix_lens=torch.tensor([pos], device=DEV, dtype=torch.int32), kv_indices=table,
                             table_rows=rows, max_extend_len=c, page_size=page_size)
        outs.append(o)
        pos += c
    rec.bitwise(f"extend_chunks[{tag}]", torch.cat(outs), full[:pos], n_chunks=len(outs))


def _chunks(L, size):
    return [size] * math.ceil(L / size)


def run_checks(rec, quick: bool = False) -> None:
    torch.manual_seed(0)
    random.seed(0)
    head_cfgs = [(32, 8, 128), (16, 2, 128), (40, 8, 128), (64, 8, 128), (32, 32, 128), (16, 4, 64), (28, 4, 128)]
    if quick:
        head_cfgs = head_cfgs[:2]
    for (Hq, Hkv, D) in head_cfgs:
        for dtype in (torch.bfloat16, torch.float16):
            tag = f"{Hq}/{Hkv}/d{D}/{str(dtype)[6:]}"
            prompt, answer = (1000, 129) if (Hq, Hkv) != (32, 8) else (4097, 300)
            for ps in (1, 16):
                res = rec.run(f"prefix_decode[{tag}/p{ps}]", _check_prefix_and_decode, rec, Hq, Hkv, D, dtype,
                              prompt, answer, ps, f"{tag}/p{ps}")
                if res is None:
                    continue
                q, k, v, full = res
                if dtype == torch.bfloat16 and ps == 1:
                    for cs in (1, 7, 64):
                        n = 300 if cs == 1 else (1000 if cs == 7 else len(q))
                        rec.run(f"extend_c{cs}[{tag}]", _check_extend_chunks, rec, q[:n].contiguous(),
                                k[:n].contiguous(), v[:n].contiguous(), full[:n], _chunks(n, cs), ps, f"{tag}/c{cs}")
                    rnd = []
                    left = len(q)
                    while left > 0:
                        c = random.randint(1, 700)
                        rnd.append(c)
                        left -= c
                    rec.run(f"extend_random[{tag}]", _check_extend_chunks, rec, q, k, v, full, rnd, ps, f"{tag}/rnd")
                if ps == 16:
                    res2 = rec.run(f"extend_p16[{tag}]", _check_extend_chunks, rec, q, k, v, full, [513, 1000, 4000],
                                   16, f"{tag}/p16")
    rec.run("long_prompt_16k", _check_long, rec, quick)
    rec.run("packed_vs_separate", _check_packed, rec)
    rec.run("batched_decode_mixed", _check_batched_decode, rec, 64 if quick else 256)
    rec.run("cuda_graph_decode", _check_graph, rec)
    rec.run("free_knobs", _check_free_knobs, rec)
    rec.run("accuracy", _check_accuracy, rec, quick)
    rec.run("backward", _check_backward, rec)
    # a training cell of the benchmark (b4 x L 4224, Qwen3-8B heads): many key blocks per query block, where
    # an atomic dQ accumulation would reorder
    rec.run("backward_b4_L4224", _check_backward, rec, (4224,) * 4, (32, 8, 128))


def _check_long(rec, quick):
    L = 8192 if quick else 16384
    Hq, Hkv, D = 32, 8, 128
    q, k, v = _rand(L, Hq, D), _rand(L, Hkv, D), _rand(L, Hkv, D)
    full = attention_varlen(q, k, v, _cu([L]), L)
    k_pool, v_pool, table, _ = _pool_from_seqs([k], [v])
    pos = torch.tensor([1, 511, 512, 513, 1024, 4095, 8191, L - 1], device=DEV)
    seq_lens = (pos + 1).to(torch.int32)
    dec = attention_decode(q[pos].contiguous(), k_pool, v_pool, seq_lens=seq_lens, kv_indices=table,
                           table_rows=torch.zeros(len(pos), dtype=torch.int32, device=DEV))
    rec.bitwise(f"decode_rows_long[{L}]", full[pos], dec)
    # chunked prefill in 4K chunks (SGLang chunked_prefill_size-like)
    _check_extend_chunks(rec, q, k, v, full, _chunks(L, 4096), 1, f"long{L}/c4096")


def _check_packed(rec):
    Hq, Hkv, D = 32, 8, 128
    lens = [1, 17, 127, 129, 1000, 4097, 513, 64]
    T = sum(lens)
    q, k, v = _rand(T, Hq, D), _rand(T, Hkv, D), _rand(T, Hkv, D)
    packed = attention_varlen(q, k, v, _cu(lens), max(lens))
    outs = []
    s = 0
    for n in lens:
        outs.append(attention_varlen(q[s:s + n].contiguous(), k[s:s + n].contiguous(), v[s:s + n].contiguous(), _cu([n]), n))
        s += n
    rec.bitwise("packed_vs_separate", packed, torch.cat(outs), lens=lens)


def _check_batched_decode(rec, B):
    Hq, Hkv, D = 32, 8, 128
    lens = [random.randint(1, 8192) for _ in range(B)]
    lens[:4] = [1, 512, 513, 8192]
    ks = [_rand(n, Hkv, D) for n in lens]
    vs = [_rand(n, Hkv, D) for n in lens]
    k_pool, v_pool, table, rows = _pool_from_seqs(ks, vs)
    q = _rand(B, Hq, D)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    batched = attention_decode(q, k_pool, v_pool, seq_lens=seq_lens, kv_indices=table, table_rows=rows)
    single = torch.cat([attention_decode(q[i:i + 1].contiguous(), k_pool, v_pool, seq_lens=seq_lens[i:i + 1],
                                         kv_indices=table, table_rows=rows[i:i + 1]) for i in range(B)])
    rec.bitwise(f"batched_vs_single_decode[B={B}]", batched, single)
    # reversed order of the batch
    perm = torch.arange(B - 1, -1, -1, device=DEV)
    rev = attention_decode(q[perm].contiguous(), k_pool, v_pool, seq_lens=seq_lens[perm].contiguous(),
                           kv_indices=table, table_rows=rows[perm].contiguous())
    rec.bitwise(f"batch_order_decode[B={B}]", rev[perm.argsort()], batched)
    # max_context_len (graph capacity) larger than needed does not change bits
    big = attention_decode(q, k_pool, v_pool, seq_lens=seq_lens, kv_indices=table, table_rows=rows,
                           max_context_len=32768) if table.shape[1] >= 8192 else None
    if big is not None:
        rec.bitwise("decode_capacity_invariance", big, batched)


def _check_graph(rec):
    Hq, Hkv, D, B = 32, 8, 128, 32
    lens = [random.randint(100, 6000) for _ in range(B)]
    ks = [_rand(n + 200, Hkv, D) for n in lens]
    vs = [_rand(n + 200, Hkv, D) for n in lens]
    k_pool, v_pool, table, rows = _pool_from_seqs(ks, vs)
    q = _rand(B, Hq, D)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=DEV)
    out = torch.empty_like(q)
    cap = table.shape[1]

    def step():
        attention_decode(q, k_pool, v_pool, seq_lens=seq_lens, kv_indices=table, table_rows=rows,
                         max_context_len=cap, out=out)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step()
    for it in range(3):
        q.copy_(_rand(B, Hq, D))
        seq_lens.copy_(torch.tensor([n + random.randint(0, 200) for n in lens], dtype=torch.int32, device=DEV))
        g.replay()
        torch.cuda.synchronize()
        eager = attention_decode(q, k_pool, v_pool, seq_lens=seq_lens, kv_indices=table, table_rows=rows,
                                 max_context_len=cap)
        rec.bitwise(f"graph_replay_vs_eager[{it}]", out.clone(), eager)


def _check_free_knobs(rec):
    """Bits do not depend on free knobs (tile height / warps / stages)."""
    from areal_tik_plugin.runtime.loader import get_implementation

    att = get_implementation().module("attention")
    Hq, Hkv, D = 32, 8, 128
    lens = [3000, 129]
    T = sum(lens)
    q, k, v = _rand(T, Hq, D), _rand(T, Hkv, D), _rand(T, Hkv, D)
    cu = _cu(lens)
    ref = att.prefill(q, k, v, cu, max(lens), D ** -0.5)
    saved = (att.PREFILL_WARPS, att.PREFILL_STAGES)
    try:
        for bm, w, st in ((64, 4, 2), (64, 8, 3), (128, 8, 2), (16, 4, 1), (32, 4, 2)):
            att.PREFILL_WARPS, att.PREFILL_STAGES = w, st
            o = att.prefill(q, k, v, cu, max(lens), D ** -0.5, block_m=bm)
            rec.bitwise(f"prefill_block_m{bm}_w{w}_s{st}", o, ref)
    finally:
        att.PREFILL_WARPS, att.PREFILL_STAGES = saved
    k_pool, v_pool, table, rows = _pool_from_seqs([k[:3000]], [v[:3000]])
    sl = torch.tensor([3000], dtype=torch.int32, device=DEV)
    ref_d = att.decode(q[2999:3000].contiguous(), k_pool, v_pool, sl, table, rows[:1], D ** -0.5, 1, 3000)
    saved = (att.DECODE_WARPS, att.DECODE_STAGES)
    try:
        for w, st in ((2, 1), (4, 3), (8, 2), (8, 4)):
            att.DECODE_WARPS, att.DECODE_STAGES = w, st
            o = att.decode(q[2999:3000].contiguous(), k_pool, v_pool, sl, table, rows[:1], D ** -0.5, 1, 3000)
            rec.bitwise(f"decode_w{w}_s{st}", o, ref_d)
        for bd, mw in ((0, 4), (16, 1), (32, 1), (64, 2), (128, 1)):  # the merge kernel, sliced over D
            o = att.decode(q[2999:3000].contiguous(), k_pool, v_pool, sl, table, rows[:1], D ** -0.5, 1, 3000,
                           merge_block_d=bd, merge_warps=mw, merge_in_last=False)
            rec.bitwise(f"decode_merge_d{bd}_w{mw}", o, ref_d)
        for it in range(3):  # the merge in the last split program: tickets reset, repeated calls agree
            o = att.decode(q[2999:3000].contiguous(), k_pool, v_pool, sl, table, rows[:1], D ** -0.5, 1, 3000,
                           merge_in_last=True)
            rec.bitwise(f"decode_merge_in_last[{it}]", o, ref_d)
    finally:
        att.DECODE_WARPS, att.DECODE_STAGES = saved
    ro = get_implementation().module("_rowops")
    saved_pdl = ro.PDL
    try:  # programmatic dependent launch off (free knob)
        ro.PDL = False
        rec.bitwise("prefill_no_pdl", att.prefill(q, k, v, cu, max(lens), D ** -0.5), ref)
        rec.bitwise("decode_no_pdl", att.decode(q[2999:3000].contiguous(), k_pool, v_pool, sl, table, rows[:1],
                                                D ** -0.5, 1, 3000), ref_d)
    finally:
        ro.PDL = saved_pdl
    rec.bitwise("decode_vs_prefill_free_knobs", ref_d, ref[2999:3000])


def _sdpa_ref(q, k, v, lens, dtype=torch.float32, backend=None):
    """Per-sequence SDPA with GQA expansion; q [T,Hq,D]."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    outs = []
    s = 0
    g = q.shape[1] // k.shape[1]
    for n in lens:
        qq = q[s:s + n].transpose(0, 1).unsqueeze(0).to(dtype)
        kk = k[s:s + n].repeat_interleave(g, 1).transpose(0, 1).unsqueeze(0).to(dtype)
        vv = v[s:s + n].repeat_interleave(g, 1).transpose(0, 1).unsqueeze(0).to(dtype)
        if backend is None:
            with sdpa_kernel([SDPBackend.MATH]):
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        else:
            with sdpa_kernel([backend]):
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        outs.append(o[0].transpose(0, 1))
        s += n
    return torch.cat(outs)


# accuracy tolerance table (abs/rel vs fp32 math); bf16 output ulp at |x|<1 is 2^-8
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}


def _check_accuracy(rec, quick):
    from torch.nn.attention import SDPBackend

    for dtype in (torch.bfloat16, torch.float16):
        for Hq, Hkv, D in ((32, 8, 128), (16, 2, 64)):
            lens = [1, 17, 127, 129, 1000, 2049]
            T = sum(lens)
            q, k, v = _rand(T, Hq, D, dtype=dtype), _rand(T, Hkv, D, dtype=dtype), _rand(T, Hkv, D, dtype=dtype)
            o = attention_varlen(q, k, v, _cu(lens), max(lens))
            ref = _sdpa_ref(q, k, v, lens)
            atol, rtol = TOL[dtype]
            tag = f"{Hq}/{Hkv}/d{D}/{str(dtype)[6:]}"
            rec.close(f"accuracy_vs_fp32[{tag}]", o, ref, atol=atol, rtol=rtol)
            try:
                cud = _sdpa_ref(q, k, v, lens, dtype=dtype, backend=SDPBackend.CUDNN_ATTENTION)
                rec.close(f"accuracy_vs_cudnn[{tag}]", o, cud, atol=atol, rtol=rtol)
                err_c = float((cud.double() - ref.double()).abs().max())
                err_o = float((o.double() - ref.double()).abs().max())
                rec.check(f"error_not_worse_than_cudnn[{tag}]", err_o <= 2 * err_c + 1e-3, ours=err_o, cudnn=err_c)
            except Exception as e:
                rec.check(f"accuracy_vs_cudnn[{tag}]", True, skipped=f"cuDNN SDPA unavailable: {e}"[:200])


def _check_backward(rec, lens=(17, 300, 1000, 129), heads=(16, 4, 128), repeats=3):
    """Gradients against fp32 autograd (the tolerance table), and the same bits on every repeat of one call:
    the backward has no bit contract with rollout, but a policy update that cannot be replayed cannot be
    debugged, and ``tik search`` refuses a nondeterministic backward (``train_determinism``), so the suite
    holds every implementation to it. Repeats catch the usual cause, fp32 atomics whose order varies."""
    Hq, Hkv, D = heads
    lens = list(lens)
    T = sum(lens)
    cell = f"{Hq}/{Hkv}/d{D}/T{T}"
    for dtype in (torch.bfloat16, torch.float16):
        tag = f"{cell}/{str(dtype)[6:]}"
        q = _rand(T, Hq, D, dtype=dtype).requires_grad_()
        k = _rand(T, Hkv, D, dtype=dtype).requires_grad_()
        v = _rand(T, Hkv, D, dtype=dtype).requires_grad_()
        do = _rand(T, Hq, D, dtype=dtype)
        o = attention_varlen(q, k, v, _cu(lens), max(lens))
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
        qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
        orf = _sdpa_ref(qr, kr, vr, lens)
        dqr, dkr, dvr = torch.autograd.grad(orf, (qr, kr, vr), do.float())
        for name, a, b in (("dq", dq, dqr), ("dk", dk, dkr), ("dv", dv, dvr)):
            rel = float((a.double() - b.double()).norm() / b.double().norm())
            rec.check(f"grad_{name}[{tag}]", rel < (2e-2 if dtype == torch.bfloat16 else 5e-3), rel_l2=rel)
        for r in range(repeats):
            again = torch.autograd.grad(attention_varlen(q, k, v, _cu(lens), max(lens)), (q, k, v), do)
            for name, a, first in zip(("dq", "dk", "dv"), again, (dq, dk, dv)):
                rec.bitwise(f"grad_repeat_{name}[{tag}/{r + 1}]", a, first)


# ------------------------------------------------------------------------------------------------
# benchmarks
# ------------------------------------------------------------------------------------------------
def _sdpa_prefill_fn(B, L, Hq, Hkv, D, backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = _rand(B, Hq, L, D)
    k = _rand(B, Hkv, L, D)
    v = _rand(B, Hkv, L, D)
    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}[backend]

    def fn():
        with sdpa_kernel([be]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    return fn


def _sdpa_decode_fn(B, ctx, Hq, Hkv, D):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = _rand(B, Hq, 1, D)
    k = _rand(B, Hkv, ctx, D)
    v = _rand(B, Hkv, ctx, D)

    def fn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    return fn




# FlashInfer baselines (SGLang's flashinfer attention backend calls these wrappers) ---------------------
_FI_WS: dict = {}
FI_PREFILL_BACKENDS = ("fa2", "fa3")  # fa3: the sm90 (Hopper) kernels; --fi-prefill-backends cuts the list
FI_PREFILL_CHOSEN = None  # --fi-prefill-backends of python -m areal_tik_plugin.contract (configure()); None: all
FI_DECODE_PAGES = (1, 16)             # SGLang's flashinfer backend runs page 1; 16 is FlashInfer's common choice
GRAPH_MAX_COLD_US = 5000.0            # CUDA-graph timing only where launch cost can matter (cold < 5 ms)


def _fi_ws():
    if "ws" not in _FI_WS:
        _FI_WS["ws"] = torch.zeros(256 << 20, dtype=torch.uint8, device=DEV)
    return _FI_WS["ws"]


def configure(fi_prefill_backends: str | None = None) -> None:
    global FI_PREFILL_CHOSEN
    if fi_prefill_backends is None:
        FI_PREFILL_CHOSEN = None
        return
    got = tuple(b for b in fi_prefill_backends.split(",") if b)
    bad = [b for b in got if b not in FI_PREFILL_BACKENDS]
    if bad:
        raise ValueError(f"--fi-prefill-backends: expected names from {FI_PREFILL_BACKENDS}, got {bad}")
    FI_PREFILL_CHOSEN = got


def _fi_prefill_backends():
    return FI_PREFILL_CHOSEN if FI_PREFILL_CHOSEN is not None else FI_PREFILL_BACKENDS


def _fi_ragged_prefill(backend, q, k, v, lens, Hq, Hkv, D):
    """Factory: FlashInfer's ragged causal prefill (SGLang's extend without a cached prefix) over
    q/k/v [sum(lens), H, D], planned once outside the timed call."""
    fi = B.flashinfer(f"prefill_{backend}")
    cu = _cu(lens)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(_fi_ws(), "NHD", backend=backend)
    w.plan(cu, cu, Hq, Hkv, D, causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
    out = torch.empty_like(q)
    return lambda: w.run(q, k, v, out=out)


def fi_page_table(lens, page_size, seed=0):
    """(indptr, indices, last_page_len) of a paged cache holding sequences of ``lens`` tokens in pages
    of ``page_size`` placed in a random order (as a serving pool hands them out); int32 on the CPU."""
    if page_size < 1 or any(n < 1 for n in lens):
        raise ValueError(f"fi_page_table: expected page_size >= 1 and lens >= 1, got {page_size}, {list(lens)[:8]}")
    n_pages = [math.ceil(n / page_size) for n in lens]
    g = torch.Generator(device="cpu").manual_seed(seed)
    indices = torch.randperm(sum(n_pages), generator=g).to(torch.int32)
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(n_pages), 0)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lens, n_pages)], dtype=torch.int32)
    return indptr, indices, last


def _fi_decode(q, lens, page_size, tensor_cores, Hkv, D):
    """Factory: FlashInfer's paged decode wrapper in its CUDA-graph mode (fixed index buffers, planned
    once), over a random paged cache [pages, 2, page_size, Hkv, D] (NHD)."""
    fi = B.flashinfer("prefill_fa2" if tensor_cores else "decode")
    indptr, indices, last = (t.to(DEV) for t in fi_page_table(lens, page_size))
    cache = torch.randn(int(indices.numel()), 2, page_size, Hkv, D, device=DEV, dtype=torch.bfloat16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(
        _fi_ws(), "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores, paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last)
    w.plan(indptr, indices, last, q.shape[1], Hkv, D, page_size, q_data_type=torch.bfloat16,
           kv_data_type=torch.bfloat16)
    out = torch.empty_like(q)
    return lambda: w.run(q, cache, out=out)


def _fi_decode_candidates(q, lens, Hkv, D):
    return {f"flashinfer.BatchDecodeWithPagedKVCacheWrapper (page {p}, use_tensor_cores={tc}, CUDA-graph mode)":
            (lambda p=p, tc=tc: _fi_decode(q, lens, p, tc, Hkv, D)) for p in FI_DECODE_PAGES for tc in (False, True)}


def _timer(rec, label, fn, graph):
    """suite.timed, with the CUDA-graph method only where the cold time is under GRAPH_MAX_COLD_US."""
    t = _time(rec, label, fn, graph=False)
    if t and graph and t["cold_us"] < GRAPH_MAX_COLD_US:
        try:
            g = bench.time_graph_spread(fn)
            t.update(graph_us=g["median"], graph_min_us=g["min"], graph_max_us=g["max"], graph_rounds=g["n"])
        except Exception as e:
            t["graph_error"] = f"{type(e).__name__}: {e}"[:200]
    elif t and graph:
        t["graph_skipped"] = f"cold {t['cold_us']:.0f} us >= {GRAPH_MAX_COLD_US:.0f} us: launch cost negligible"
    return t


def _sdpa_cands(B_, L, Hq, Hkv, D):
    return {"torch SDPA cuDNN (SDPBackend.CUDNN_ATTENTION)": lambda: _req_cudnn(_sdpa_prefill_fn(B_, L, Hq, Hkv, D, "cudnn")),
            "torch SDPA flash (SDPBackend.FLASH_ATTENTION, FA2)": lambda: _sdpa_prefill_fn(B_, L, Hq, Hkv, D, "fa2")}


def _req_cudnn(fn):
    B.require("cudnn")
    return fn


def run_bench(rec, quick: bool = False) -> None:
    """Ours vs the strongest of cuDNN SDPA, torch's flash SDPA and FlashInfer (ragged prefill FA2 / FA3;
    paged decode at its best qualified configuration per cell, CUDA-graph mode) for prefill, decode,
    rollout-sized mixed-length decode and training forward+backward; the padded masked SDPA decode as
    context only."""
    torch.manual_seed(0)
    Hq, Hkv, D = 32, 8, 128
    rows = {"prefill": [], "decode": [], "decode_mixed": [], "train_fwd_bwd": []}
    Bs = (1, 4, 8, 16)
    Ls = (1024, 4096, 8192, 16384) if not quick else (1024, 8192)
    for Bn in Bs:
        for L in Ls:
            q, k, v = _rand(Bn * L, Hq, D), _rand(Bn * L, Hkv, D), _rand(Bn * L, Hkv, D)
            cu = _cu([L] * Bn)
            facs = _sdpa_cands(Bn, L, Hq, Hkv, D)
            for be in _fi_prefill_backends():
                facs[f"flashinfer.BatchPrefillWithRaggedKVCacheWrapper (backend={be}, causal)"] = (
                    lambda be=be: _fi_ragged_prefill(be, q, k, v, [L] * Bn, Hq, Hkv, D))
            base = B.collect(rec, "attention.prefill", facs)
            flops = 4 * Bn * L * L / 2 * Hq * D
            row = B.compare(rec, f"prefill_b{Bn}_L{L}", lambda: attention_varlen(q, k, v, cu, L), base, None,
                            timer=_timer, kind="prefill", B=Bn, L=L, flops=flops)
            ours = row["ours"]
            row["ours_tflops_cold"] = flops / (ours["cold_us"] * 1e-6) / 1e12 if ours else None
            rows["prefill"].append(row)
            q = k = v = None  # noqa: F841 (frees the cell's tensors)
            torch.cuda.empty_cache()
    # decode grid
    ctxs = (128, 1024, 4096, 8192)
    for Bn in Bs:
        for ctx in ctxs:
            ks = [_rand(ctx, Hkv, D) for _ in range(Bn)]
            vs = [_rand(ctx, Hkv, D) for _ in range(Bn)]
            k_pool, v_pool, table, trows = _pool_from_seqs(ks, vs, n_spare=16)
            k16, v16, t16, _ = _pool_from_seqs(ks, vs, page_size=16, n_spare=16)
            kd = torch.stack(ks)
            vd = torch.stack(vs)
            q = _rand(Bn, Hq, D)
            sl = torch.full((Bn,), ctx, dtype=torch.int32, device=DEV)
            out = torch.empty_like(q)
            facs = {"torch SDPA cuDNN (SDPBackend.CUDNN_ATTENTION, dense cache)":
                    lambda: _req_cudnn(_sdpa_decode_fn(Bn, ctx, Hq, Hkv, D)),
                    **_fi_decode_candidates(q, [ctx] * Bn, Hkv, D)}
            base = B.collect(rec, "attention.decode", facs)
            nbytes = 2 * Bn * ctx * Hkv * D * 2
            row = B.compare(rec, f"decode_b{Bn}_ctx{ctx}", lambda: attention_decode(
                q, k_pool, v_pool, seq_lens=sl, kv_indices=table, table_rows=trows, max_context_len=ctx, out=out),
                base, None, timer=_timer, kind="decode", B=Bn, ctx=ctx, bytes=nbytes, ours_page_size=1)
            row["ours_page16"] = _timer(rec, "decode_p16", lambda: attention_decode(
                q, k16, v16, seq_lens=sl, kv_indices=t16, table_rows=trows, page_size=16, max_context_len=ctx,
                out=out), True)
            row["ours_dense"] = _timer(rec, "decode_dense", lambda: attention_decode(q, kd, vd, seq_lens=sl, out=out),
                                       True)
            paged = row["ours"]
            if paged:
                bw = nbytes / (paged["cold_us"] * 1e-6) / 1e12
                row["ours_tbps_cold"] = bw
                row["ours_share_cold"] = B.shares(bw, B.measured_copy_tbps())
            rows["decode"].append(row)
            ks = vs = k_pool = v_pool = k16 = v16 = kd = vd = None  # noqa: F841 (frees the cell's tensors)
    # rollout-sized mixed-length batches
    rng = random.Random(0)
    for Bn in (64, 256):
        lens = [rng.randint(128, 4096) for _ in range(Bn)]
        ks = [_rand(n, Hkv, D) for n in lens]
        vs = [_rand(n, Hkv, D) for n in lens]
        k_pool, v_pool, table, trows = _pool_from_seqs(ks, vs, n_spare=16)
        ks = vs = None  # noqa: F841 (frees the cell's tensors)
        q = _rand(Bn, Hq, D)
        sl = torch.tensor(lens, dtype=torch.int32, device=DEV)
        out = torch.empty_like(q)
        cap = table.shape[1]
        Lmax = max(lens)
        kd = _rand(Bn, Hkv, Lmax, D)
        vd = _rand(Bn, Hkv, Lmax, D)
        qd = _rand(Bn, Hq, 1, D)
        mask = (torch.arange(Lmax, device=DEV)[None, :] < sl[:, None]).view(Bn, 1, 1, Lmax)

        def padded():
            return F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, enable_gqa=True)

        base = B.collect(rec, "attention.decode_mixed", _fi_decode_candidates(q, lens, Hkv, D))
        nbytes = 2 * sum(lens) * Hkv * D * 2
        row = B.compare(rec, f"decode_mixed_b{Bn}", lambda: attention_decode(
            q, k_pool, v_pool, seq_lens=sl, kv_indices=table, table_rows=trows, max_context_len=cap, out=out),
            base, {"sdpa_masked_padded_cache": padded}, timer=_timer, kind="decode_mixed", B=Bn,
            mean_ctx=sum(lens) / Bn, bytes=nbytes)
        if row["ours"]:
            row["ours_tbps_cold"] = bw = nbytes / (row["ours"]["cold_us"] * 1e-6) / 1e12
            row["ours_share_cold"] = B.shares(bw, B.measured_copy_tbps())
        rows["decode_mixed"].append(row)
        k_pool = v_pool = kd = vd = None  # noqa: F841 (frees the cell's tensors)
        torch.cuda.empty_cache()
    # training forward+backward at L+128 (policy update); FlashInfer has no backward
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for Bn, L in ((1, 1024 + 128), (4, 4096 + 128), (1, 16384 + 128)):
        q, k, v = (_rand(Bn * L, h, D).requires_grad_() for h in (Hq, Hkv, Hkv))
        do = _rand(Bn * L, Hq, D)
        cu = _cu([L] * Bn)

        def ours_fb():
            o = attention_varlen(q, k, v, cu, L)
            return torch.autograd.grad(o, (q, k, v), do)

        qs, ks_, vs_ = (_rand(Bn, h, L, D).requires_grad_() for h in (Hq, Hkv, Hkv))
        dos = _rand(Bn, Hq, L, D)

        def sdpa_fb(be):
            def fn():
                with sdpa_kernel([be]):
                    o = F.scaled_dot_product_attention(qs, ks_, vs_, is_causal=True, enable_gqa=True)
                return torch.autograd.grad(o, (qs, ks_, vs_), dos)
            return fn

        base = B.collect(rec, "attention.train_fwd_bwd", {
            "torch SDPA cuDNN fwd+bwd (SDPBackend.CUDNN_ATTENTION)": lambda: _req_cudnn(sdpa_fb(SDPBackend.CUDNN_ATTENTION)),
            "torch SDPA flash fwd+bwd (SDPBackend.FLASH_ATTENTION, FA2)": lambda: sdpa_fb(SDPBackend.FLASH_ATTENTION),
            "flashinfer": lambda: (B.flashinfer(), _no_fi_backward())[1],
        })
        rows["train_fwd_bwd"].append(B.compare(rec, f"train_fb_b{Bn}_L{L}", ours_fb, base, None, graph=False,
                                               kind="train_fwd_bwd", B=Bn, L=L))
        q = k = v = qs = ks_ = vs_ = None  # noqa: F841 (frees the cell's tensors)
    B.summarize(rec, [r for v in rows.values() for r in v])
    for kind, v in rows.items():
        B.summarize(rec, v, prefix=f"{kind}.")


def _no_fi_backward():
    raise B.Unavailable("flashinfer: its attention kernels are inference-only (no backward)")

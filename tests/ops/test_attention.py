"""Unified attention on the CPU (Triton interpreter): bitwise token invariance, accuracy, gradients,
input validation. Bits on CPU prove the algorithm; the GPU suite (areal_tik_plugin.contract.attention)
proves the contract on the H200."""

from __future__ import annotations

import math
import random

import pytest
import torch

from areal_tik_plugin.runtime.loader import get_implementation
from areal_tik_plugin.ops import attention_decode, attention_extend, attention_varlen

from tests.helpers.tolerances import ATTN_TOL


def bits(x):
    return x.contiguous().view(torch.int16)


def assert_bitwise(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.isfinite(a.float()).all()
    same = torch.equal(bits(a), bits(b))
    if not same:
        d = (a.float() - b.float()).abs()
        raise AssertionError(f"not bit-identical: max |diff| {d.max().item()}, rows differing "
                             f"{int((d.reshape(d.shape[0], -1) > 0).any(1).sum())} / {d.shape[0]}")


def cu(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def make_pool(seqs_k, seqs_v, page_size=1, seed=0, spare=5):
    """Random slot (page) permutation; slot/page 0 reserved. Returns pool, pool, table, rows."""
    g = torch.Generator().manual_seed(seed)
    Hkv, D = seqs_k[0].shape[1:]
    n_pages = sum(math.ceil(k.shape[0] / page_size) for k in seqs_k) + spare
    perm = (torch.randperm(n_pages, generator=g) + 1).tolist()
    kp = torch.randn((n_pages + 1) * page_size, Hkv, D, dtype=seqs_k[0].dtype, generator=g)
    vp = torch.randn((n_pages + 1) * page_size, Hkv, D, dtype=seqs_k[0].dtype, generator=g)
    width = max(math.ceil(k.shape[0] / page_size) for k in seqs_k) + 1
    table = torch.zeros(len(seqs_k), width, dtype=torch.int32)
    it = iter(perm)
    for r, (k, v) in enumerate(zip(seqs_k, seqs_v)):
        for p in range(math.ceil(k.shape[0] / page_size)):
            pid = next(it)
            table[r, p] = pid
            lo, hi = p * page_size, min(k.shape[0], (p + 1) * page_size)
            kp[pid * page_size: pid * page_size + hi - lo] = k[lo:hi]
            vp[pid * page_size: pid * page_size + hi - lo] = v[lo:hi]
    return kp, vp, table, torch.arange(len(seqs_k), dtype=torch.int32)


def qkv(T, Hq, Hkv, D, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, Hq, D, generator=g).to(dtype), torch.randn(T, Hkv, D, generator=g).to(dtype),
            torch.randn(T, Hkv, D, generator=g).to(dtype))


def ref_attention(q, k, v, lens, scale=None):
    """fp64 reference, per sequence, GQA by head repetition."""
    outs, s = [], 0
    g = q.shape[1] // k.shape[1]
    D = q.shape[2]
    scale = D ** -0.5 if scale is None else scale
    for n in lens:
        qq = q[s:s + n].double().transpose(0, 1)
        kk = k[s:s + n].double().repeat_interleave(g, 1).transpose(0, 1)
        vv = v[s:s + n].double().repeat_interleave(g, 1).transpose(0, 1)
        a = (qq @ kk.transpose(-1, -2)) * scale
        a = a.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf")).softmax(-1)
        outs.append((a @ vv).transpose(0, 1))
        s += n
    return torch.cat(outs)


# --------------------------------------------------------------------------------------------
# bitwise token invariance
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("Hq,Hkv,D,prompt,answer", [(4, 2, 64, 17, 23), (8, 1, 32, 129, 9), (2, 2, 128, 1, 16)])
def test_prefix_rows_and_decode_rows(Hq, Hkv, D, prompt, answer):
    L = prompt + answer
    q, k, v = qkv(L, Hq, Hkv, D)
    full = attention_varlen(q, k, v, cu([L]))
    pre = attention_varlen(q[:prompt].contiguous(), k[:prompt].contiguous(), v[:prompt].contiguous(), cu([prompt]))
    assert_bitwise(full[:prompt], pre)
    seq_lens = torch.arange(prompt + 1, L + 1, dtype=torch.int32)
    for ps in (1, 16):
        kp, vp, table, _ = make_pool([k], [v], page_size=ps)
        rows = torch.zeros(answer, dtype=torch.int32)
        dec = attention_decode(q[prompt:].contiguous(), kp, vp, seq_lens=seq_lens, kv_indices=table,
                               table_rows=rows, page_size=ps)
        assert_bitwise(dec, full[prompt:])
    dense_k = k.unsqueeze(0).expand(answer, L, Hkv, D).contiguous()
    dense_v = v.unsqueeze(0).expand(answer, L, Hkv, D).contiguous()
    assert_bitwise(attention_decode(q[prompt:].contiguous(), dense_k, dense_v, seq_lens=seq_lens), full[prompt:])


@pytest.mark.parametrize("chunks", [[1] * 12, [7, 7, 7, 7, 7, 2], [64, 9], "random"])
def test_extend_chunks_equal_full(chunks):
    L = 73
    q, k, v = qkv(L, 4, 2, 64, seed=1)
    full = attention_varlen(q, k, v, cu([L]))
    if chunks == "random":
        rnd = random.Random(3)
        chunks, left = [], L
        while left > 0:
            c = rnd.randint(1, 30)
            chunks.append(min(c, left))
            left -= c
    kp, vp, table, rows = make_pool([k], [v])
    pos, outs = 0, []
    for c in chunks:
        o = attention_extend(q[pos:pos + c].contiguous(), kp, vp, cu_seqlens_q=cu([c]),
                             prefix_lens=torch.tensor([pos], dtype=torch.int32), kv_indices=table, table_rows=rows)
        outs.append(o)
        pos += c
    assert_bitwise(torch.cat(outs), full[:pos])


def test_extend_batched_requests_page16():
    """Several requests extending at once (different prefixes) == each full sequence."""
    lens, prefixes = [40, 19, 33], [25, 0, 31]
    qs, ks, vs, fulls = [], [], [], []
    for i, L in enumerate(lens):
        q, k, v = qkv(L, 4, 2, 64, seed=10 + i)
        qs.append(q), ks.append(k), vs.append(v)
        fulls.append(attention_varlen(q, k, v, cu([L])))
    for ps in (1, 16):
        kp, vp, table, rows = make_pool(ks, vs, page_size=ps, seed=7)
        new = [L - p for L, p in zip(lens, prefixes)]
        qn = torch.cat([q[p:] for q, p in zip(qs, prefixes)])
        o = attention_extend(qn, kp, vp, cu_seqlens_q=cu(new), prefix_lens=torch.tensor(prefixes, dtype=torch.int32),
                             kv_indices=table, table_rows=rows, page_size=ps)
        assert_bitwise(o, torch.cat([f[p:] for f, p in zip(fulls, prefixes)]))


def test_batched_decode_mixed_lengths_equals_single():
    lens = [1, 5, 64, 65, 100, 17]
    ks = [qkv(n, 1, 2, 64, seed=20 + i)[1] for i, n in enumerate(lens)]
    vs = [qkv(n, 1, 2, 64, seed=40 + i)[2] for i, n in enumerate(lens)]
    kp, vp, table, rows = make_pool(ks, vs, seed=2)
    q = qkv(len(lens), 8, 2, 64, seed=5)[0]
    sl = torch.tensor(lens, dtype=torch.int32)
    batched = attention_decode(q, kp, vp, seq_lens=sl, kv_indices=table, table_rows=rows)
    for i in range(len(lens)):
        single = attention_decode(q[i:i + 1].contiguous(), kp, vp, seq_lens=sl[i:i + 1], kv_indices=table,
                                  table_rows=rows[i:i + 1])
        assert_bitwise(single, batched[i:i + 1])
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    shuffled = attention_decode(q[perm].contiguous(), kp, vp, seq_lens=sl[perm].contiguous(), kv_indices=table,
                                table_rows=rows[perm].contiguous())
    assert_bitwise(shuffled, batched[perm])
    # capacity (graph-capture bound) larger than needed: same bits
    assert_bitwise(attention_decode(q, kp, vp, seq_lens=sl, kv_indices=table, table_rows=rows,
                                    max_context_len=table.shape[1] * 4), batched)


def test_packed_varlen_equals_each_sequence():
    lens = [1, 17, 3, 40, 2]
    q, k, v = qkv(sum(lens), 4, 4, 64, seed=9)
    packed = attention_varlen(q, k, v, cu(lens))
    s = 0
    for n in lens:
        alone = attention_varlen(q[s:s + n].contiguous(), k[s:s + n].contiguous(), v[s:s + n].contiguous(), cu([n]))
        assert_bitwise(packed[s:s + n], alone)
        s += n


def test_paged_random_permutation_equals_contiguous():
    L = 50
    q, k, v = qkv(L, 4, 2, 64, seed=11)
    sl = torch.tensor([L], dtype=torch.int32)
    kp, vp, table, rows = make_pool([k], [v], seed=123)
    kp2, vp2, table2, rows2 = make_pool([k], [v], seed=456)
    a = attention_decode(q[-1:].contiguous(), kp, vp, seq_lens=sl, kv_indices=table, table_rows=rows)
    b = attention_decode(q[-1:].contiguous(), kp2, vp2, seq_lens=sl, kv_indices=table2, table_rows=rows2)
    c = attention_decode(q[-1:].contiguous(), k.unsqueeze(0).contiguous(), v.unsqueeze(0).contiguous(), seq_lens=sl)
    assert_bitwise(a, b)
    assert_bitwise(a, c)


@pytest.mark.parametrize("tile,split", [(32, 64), (16, 32)])
def test_multi_split_paths_agree(tile, split):
    """Small split/tile overrides exercise many split merges at interpreter-friendly lengths."""
    att = get_implementation().module("attention")
    L, prompt = 110, 86   # 4 KV splits of 32 (7 tiles of 16) at the last row; 24 decode / extend rows
    q, k, v = qkv(L, 4, 2, 32, seed=12)
    sc = 32 ** -0.5
    full = att.prefill(q, k, v, cu([L]), L, sc, tile=tile, split=split)
    full_bm16 = att.prefill(q, k, v, cu([L]), L, sc, tile=tile, split=split, block_m=16)
    full_scratch = att.prefill(q, k, v, cu([L]), L, sc, tile=tile, split=split, scratch=True)
    assert_bitwise(full_bm16, full)
    assert_bitwise(full_scratch, full)
    kp, vp, table, rows = make_pool([k], [v])
    dec = att.decode(q[prompt:].contiguous(), kp, vp, torch.arange(prompt + 1, L + 1, dtype=torch.int32), table,
                     torch.zeros(L - prompt, dtype=torch.int32), sc, 1, table.shape[1], tile=tile, split=split)
    assert_bitwise(dec, full[prompt:])
    # the split merge in a second kernel, sliced over the head dim, or in the last split program of each
    # (request, kv head) (free knobs): same bits
    for bd, last in ((0, False), (8, False), (16, False), (0, True)):
        assert_bitwise(att.decode(q[prompt:].contiguous(), kp, vp, torch.arange(prompt + 1, L + 1, dtype=torch.int32),
                                  table, torch.zeros(L - prompt, dtype=torch.int32), sc, 1, table.shape[1],
                                  tile=tile, split=split, merge_block_d=bd, merge_in_last=last), dec)
    ext = att.extend(q[prompt:].contiguous(), kp, vp, cu([L - prompt]), torch.tensor([prompt], dtype=torch.int32),
                     table, rows, L - prompt, sc, tile=tile, split=split)
    assert_bitwise(ext, full[prompt:])
    # a different split size is a different contract: the bits are allowed (and expected) to differ,
    # but accuracy holds
    ref = ref_attention(q, k, v, [L])
    assert (full.double() - ref).abs().max() < ATTN_TOL[torch.bfloat16][0]


def test_decode_merge_in_last_program_resets_its_tickets(monkeypatch):
    """The last split program of each (request, kv head) merges (atomic ticket): the tickets are back
    at 0 after every call, so repeated calls on one ticket buffer keep the merge kernel's bits, also
    with requests of 1 split (no ticket taken) next to requests of several."""
    att = get_implementation().module("attention")
    lens = [150, 20, 97]
    seqs = [qkv(n, 6, 3, 32, seed=20 + i) for i, n in enumerate(lens)]
    kp, vp, table, rows = make_pool([s[1] for s in seqs], [s[2] for s in seqs])
    q = torch.stack([s[0][-1] for s in seqs])
    sl = torch.tensor(lens, dtype=torch.int32)
    args = (q, kp, vp, sl, table, rows, 32 ** -0.5, 1, table.shape[1])
    ref = att.decode(*args, tile=16, split=32, merge_in_last=False)
    cnt = torch.zeros(16, dtype=torch.int32)
    calls = []
    monkeypatch.setattr(att, "_tickets", lambda device, n: calls.append(n) or cnt)
    for _ in range(3):
        assert_bitwise(att.decode(*args, tile=16, split=32, merge_in_last=True), ref)
        assert not cnt.any()
    assert calls == [3 * 3] * 3  # B x Hkv tickets per call


# --------------------------------------------------------------------------------------------
# accuracy (tolerance table) and gradients
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("Hq,Hkv,D", [(4, 4, 64), (4, 2, 64), (8, 2, 64), (8, 1, 128), (5, 1, 64)])
def test_accuracy_vs_fp64(dtype, Hq, Hkv, D):
    lens = [1, 17, 40]
    q, k, v = qkv(sum(lens), Hq, Hkv, D, dtype=dtype, seed=D + Hq)
    atol, rtol = ATTN_TOL[dtype]
    out = attention_varlen(q, k, v, cu(lens), softmax_scale=0.1)
    ref = ref_attention(q, k, v, lens, scale=0.1)
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)


def test_backward_matches_fp64_reference():
    lens = [17, 30, 1]
    T = sum(lens)
    q, k, v = qkv(T, 4, 2, 64, seed=31)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    do = torch.randn(T, 4, 64).to(torch.bfloat16)
    o = attention_varlen(q, k, v, cu(lens))
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    qr, kr, vr = (t.detach().double().requires_grad_() for t in (q, k, v))
    orf = ref_attention(qr, kr, vr, lens)
    dqr, dkr, dvr = torch.autograd.grad(orf, (qr, kr, vr), do.double())
    for a, b in ((dq, dqr), (dk, dkr), (dv, dvr)):
        rel = ((a.double() - b).norm() / b.norm()).item()
        assert rel < 2e-2, rel


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def test_bad_inputs_raise_clear_errors():
    q, k, v = qkv(10, 4, 2, 64)
    c = cu([10])
    with pytest.raises(TypeError, match="q: expected a torch.Tensor"):
        attention_varlen(q.numpy() if False else [1, 2], k, v, c)
    with pytest.raises(ValueError, match="dtype"):
        attention_varlen(q.float(), k.float(), v.float(), c)
    with pytest.raises(ValueError, match="same as q"):
        attention_varlen(q, k.half(), v.half(), c)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention_varlen(q[:, :3].contiguous(), k, v, c)
    with pytest.raises(ValueError, match="head_dim"):
        attention_varlen(q[..., :48].contiguous(), k[..., :48].contiguous(), v[..., :48].contiguous(), c)
    with pytest.raises(ValueError, match="last dimension"):
        attention_varlen(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, c)
    with pytest.raises(ValueError, match="non-empty"):
        attention_varlen(q[:0], k[:0], v[:0], torch.tensor([0, 0], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seqlens"):
        attention_varlen(q, k, v, torch.tensor([0, 4, 9], dtype=torch.int32))
    with pytest.raises(ValueError, match="cu_seqlens"):
        attention_varlen(q, k, v, torch.tensor([0, 10], dtype=torch.float32))
    with pytest.raises(ValueError, match="softmax_scale"):
        attention_varlen(q, k, v, c, softmax_scale=-1.0)
    kp, vp, table, rows = make_pool([k], [v])
    sl = torch.tensor([10], dtype=torch.int32)
    with pytest.raises(ValueError, match="seq_lens"):
        attention_decode(q[:1], kp, vp, seq_lens=torch.tensor([0], dtype=torch.int32), kv_indices=table, table_rows=rows)
    bad = table.clone()
    bad[0, 3] = kp.shape[0] + 7
    with pytest.raises(ValueError, match="outside the pool"):
        attention_decode(q[:1], kp, vp, seq_lens=sl, kv_indices=bad, table_rows=rows)
    with pytest.raises(ValueError, match="table_rows"):
        attention_decode(q[:1], kp, vp, seq_lens=sl, kv_indices=table, table_rows=torch.tensor([5], dtype=torch.int32))
    with pytest.raises(ValueError, match="table_rows"):
        attention_decode(q[:1], kp, vp, seq_lens=sl, kv_indices=table, table_rows=None)
    with pytest.raises(ValueError, match="page_size"):
        attention_decode(q[:1], kp, vp, seq_lens=sl, kv_indices=table, table_rows=rows, page_size=3)
    with pytest.raises(ValueError, match="exceeds"):
        attention_extend(q, kp, vp, cu_seqlens_q=c, prefix_lens=torch.tensor([100], dtype=torch.int32),
                         kv_indices=table, table_rows=rows)
    with pytest.raises(ValueError, match="prefix_lens"):
        attention_extend(q, kp, vp, cu_seqlens_q=c, prefix_lens=torch.tensor([0, 0], dtype=torch.int32),
                         kv_indices=table, table_rows=rows)

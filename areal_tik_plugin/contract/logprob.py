"""GPU contract checks and benchmarks for the token log-prob / entropy op (vocab 151936, Qwen2.5/Qwen3).

Checks (bitwise): rows of a 16384-row call == the same rows in calls of 1..4096 rows (start / middle /
end) and shuffled; padded-vocab strided view == contiguous; an fp32 copy of bf16 logits == the bf16
logits; per-row fp32 temperature tensor (the SGLang sampler) == float temperature (the trainer);
with/without entropy; autograd forward == inference forward; free launch knobs; CUDA-graph replay ==
eager. Accuracy vs fp64 (and not worse
than torch's fp32 log_softmax); gradients (log-prob and entropy) vs fp64.
Benchmarks: vs AReaL's own compiled gather_logprobs / gather_logprobs_entropy (the uncompiled chunked
torch path as context), forward and training forward+backward; Liger's fused linear cross-entropy
against cuBLAS lm_head + ours; TB/s and shares of spec / measured copy.
"""

from __future__ import annotations

import torch

from areal_tik_plugin import bench
from areal_tik_plugin.contract import baselines as B
from areal_tik_plugin.contract._rowops import (DEV, add_shares, copy_of, graph_vs_eager, knobs, rel_l2, row_slices,
                                               shuffled_rows, streamed, tbps)
from areal_tik_plugin.runtime.loader import get_implementation
from areal_tik_plugin.ops import token_logprobs

VOCAB = 151936
N_FULL = 16384   # rows of the full call (4096 with --quick)
N_ACC = 256      # rows of the fp64 accuracy checks
N_BWD = 64       # rows of the gradient checks
N_PAD = 1024     # rows of the padded-vocab view check
TOL = {"logp": (5e-5, 1e-5), "entropy": (5e-5, 1e-5)}
TOL_GRAD = {torch.bfloat16: 1e-2, torch.float32: 1e-5}
BENCH_T = (1, 8, 64, 256, 1024, 4096, 16384)
QUICK_BENCH_T = (1, 64, 4096, 16384)


def _data(T, V=None, dtype=torch.bfloat16, seed=0, scale=4.0):
    V = V or VOCAB
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(T, V, device=DEV, generator=g) * scale).to(dtype)
    tok = torch.randint(0, V, (T,), device=DEV, generator=g)
    return x, tok


def _ref(x, tok, temp):
    t = temp.double()[:, None] if isinstance(temp, torch.Tensor) else temp
    ls = torch.log_softmax(x.double() / t, -1)
    p = ls.exp()
    return ls.gather(1, tok[:, None])[:, 0], -(p * torch.where(p > 0, ls, torch.zeros_like(ls))).sum(-1)


def _areal_chunked(x, tok, temp, chunk=1024):
    """AReaL-style reference path: fp32 log_softmax of the temperature-scaled logits, gathered."""
    out = []
    for i in range(0, x.shape[0], chunk):
        ls = torch.log_softmax(x[i:i + chunk].float() / temp, -1)
        out.append(ls.gather(1, tok[i:i + chunk, None])[:, 0])
    return torch.cat(out)


# ------------------------------------------------------------------------------------------------
# contract checks
# ------------------------------------------------------------------------------------------------
def _check_rows(rec, quick):
    n = min(4096, N_FULL) if quick else N_FULL
    x, tok = _data(n, seed=1)
    temp = 0.7
    lp, ent = token_logprobs(x, tok, temp, return_entropy=True)
    for t, sl in row_slices(n, (1, 7, 64, 257, 1024, 4096)):
        a, b = token_logprobs(x[sl], tok[sl], temp, return_entropy=True)
        rec.bitwise(f"logp_rows[{t}]", a, lp[sl])
        rec.bitwise(f"entropy_rows[{t}]", b, ent[sl])
    idx = shuffled_rows(n, 1000)
    rec.bitwise("logp_shuffled1000", token_logprobs(x[idx], tok[idx], temp), lp[idx])
    rec.bitwise("logp_without_entropy", token_logprobs(x, tok, temp), lp)
    pad = torch.zeros(N_PAD, VOCAB + 128, device=DEV, dtype=x.dtype)
    pad[:, :VOCAB] = x[:N_PAD]
    rec.bitwise("logp_padded_vocab_view", token_logprobs(pad[:, :VOCAB], tok[:N_PAD], temp), lp[:N_PAD])
    del pad
    rec.bitwise("per_row_temperature_tensor_eq_float",
                token_logprobs(x, tok, torch.full((n,), temp, device=DEV)), lp)
    a, b = token_logprobs(x[:1024].float(), tok[:1024], temp, return_entropy=True)
    rec.bitwise("fp32_copy_of_bf16_logits_logp", a, lp[:1024])
    rec.bitwise("fp32_copy_of_bf16_logits_entropy", b, ent[:1024])
    xg = x[:257].clone().requires_grad_()
    a, b = token_logprobs(xg, tok[:257], temp, return_entropy=True)
    rec.bitwise("autograd_forward_eq_inference", a.detach(), lp[:257])
    rec.bitwise("autograd_entropy_eq_inference", b.detach(), ent[:257])
    temps = torch.tensor([0.6, 0.7, 1.0, 1.3], device=DEV).repeat(n // 4)
    mixed = token_logprobs(x, tok, temps)
    for i in (0, 1, 2, 3, n - 1):
        rec.bitwise(f"mixed_temperatures_row{i}", mixed[i:i + 1],
                    token_logprobs(x[i:i + 1], tok[i:i + 1], float(temps[i])))


def _check_free_knobs(rec):
    m = get_implementation().module("logprob")
    x, tok = _data(N_ACC, seed=2)
    ref = m.forward(x, tok, 1.0)
    for r, ev in ((1, False), (16, True), (64, False), (256, True)):
        with knobs(m, MERGE_ROWS=r, EVICT_FIRST=ev):
            o = m.forward(x, tok, 1.0)
        tag = f"merge_rows{r}{'/evict_first' if ev else ''}"
        rec.bitwise(f"free_knobs_logp[{tag}]", o[0], ref[0])
        rec.bitwise(f"free_knobs_entropy[{tag}]", o[1], ref[1])
    # the entropy sum without the per-element select, on rows with -inf logits and a wholly masked chunk
    xm = x.clone()
    c = get_implementation().contract.LOGPROB_VOCAB_CHUNK
    xm[0, c:2 * c] = -float("inf")
    xm[1, ::3] = -float("inf")
    tm = tok.clone()
    tm[0], tm[1] = 1, 1  # a logit that is not masked: a finite logp (the bitwise checks require finite values)
    ref_m = m.forward(xm, tm, 1.0)
    # ... and the sum of exp and the entropy sum in one two-operand reduction or in two (FUSED_SUMS; each
    # operand gets tl.sum's tree): each knob at the setting the default does not run
    # ... and whole chunks loaded without the mask (FULL_UNMASKED)
    for knob in ("SELECT_FREE", "FUSED_SUMS", "FULL_UNMASKED"):
        if not hasattr(m, knob):
            continue
        flip = not getattr(m, knob)
        for data, t, want, tag in ((x, tok, ref, knob.lower()), (xm, tm, ref_m, f"{knob.lower()}/masked")):
            with knobs(m, **{knob: flip}):
                o = m.forward(data, t, 1.0)
            tag = f"{tag}={flip}"
            for i, name in enumerate(("logp", "entropy", "lse")):
                rec.bitwise(f"free_knobs_{name}[{tag}]", o[i], want[i])


def _check_graph(rec):
    B = 64
    x, tok = _data(B, seed=3)
    temps = torch.full((B,), 0.8, device=DEV)

    def refresh(i):
        xi, ti = _data(B, seed=900 + i)
        x.copy_(xi)
        tok.copy_(ti)
        temps.copy_(torch.rand(B, device=DEV) + 0.5)

    graph_vs_eager(rec, "graph_token_logprobs", lambda: token_logprobs(x, tok, temps, return_entropy=True), refresh,
                   lambda: token_logprobs(x, tok, temps, return_entropy=True))


def _check_accuracy(rec):
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for temp in (1.0, 0.7):
            x, tok = _data(N_ACC, dtype=dtype, seed=4)
            lp, ent = token_logprobs(x, tok, temp, return_entropy=True)
            rl, re = _ref(x, tok, temp)
            tag = f"{str(dtype)[6:]}/T{temp}"
            rec.close(f"logp_vs_fp64[{tag}]", lp, rl, atol=TOL["logp"][0], rtol=TOL["logp"][1])
            rec.close(f"entropy_vs_fp64[{tag}]", ent, re, atol=TOL["entropy"][0], rtol=TOL["entropy"][1])
            tl_ = _areal_chunked(x, tok, temp)
            e_o, e_t = float((lp.double() - rl).abs().max()), float((tl_.double() - rl).abs().max())
            rec.check(f"error_vs_torch_fp32[{tag}]", e_o <= 2 * e_t + 1e-5, ours=e_o, torch_fp32=e_t)
    # masked vocab (-inf) rows, a peaked row
    x, tok = _data(8, dtype=torch.float32, seed=5)
    c = get_implementation().contract.LOGPROB_VOCAB_CHUNK
    x[0, c:2 * c] = -float("inf")
    x[1, ::2] = -float("inf")
    tok[0], tok[1] = 5, 1
    x[2, 17] = 80.0
    lp, ent = token_logprobs(x, tok, 1.0, return_entropy=True)
    rl, re = _ref(x, tok, 1.0)
    rec.close("logp_masked_rows", lp, rl, atol=TOL["logp"][0], rtol=TOL["logp"][1])
    rec.close("entropy_masked_rows", ent, re, atol=TOL["entropy"][0], rtol=TOL["entropy"][1])


def _check_backward(rec):
    for dtype in (torch.bfloat16, torch.float32):
        x, tok = _data(N_BWD, dtype=dtype, seed=6)
        x.requires_grad_()
        g1, g2 = torch.randn(N_BWD, device=DEV), torch.randn(N_BWD, device=DEV)
        lp, ent = token_logprobs(x, tok, 0.8, return_entropy=True)
        (dx,) = torch.autograd.grad((lp * g1).sum() + (ent * g2).sum(), (x,))
        x64 = x.detach().double().requires_grad_()
        rl, re = _ref(x64, tok, 0.8)
        (rx,) = torch.autograd.grad((rl * g1.double()).sum() + (re * g2.double()).sum(), (x64,))
        rel = rel_l2(dx, rx)
        rec.check(f"grad_logits[{str(dtype)[6:]}]", rel < TOL_GRAD[dtype], rel_l2=rel)


def run_checks(rec, quick: bool = False) -> None:
    torch.manual_seed(0)
    rec.run("rows", _check_rows, rec, quick)
    rec.run("free_knobs", _check_free_knobs, rec)
    rec.run("graph", _check_graph, rec)
    rec.run("accuracy", _check_accuracy, rec)
    rec.run("backward", _check_backward, rec)


# ------------------------------------------------------------------------------------------------
# benchmarks
# ------------------------------------------------------------------------------------------------
def _fwd_bwd_time(rec, name, fn):
    try:
        fn()
        torch.cuda.synchronize()
        return bench.time_both(fn, graph=False)
    except Exception as e:
        rec.errors.append(f"{name}: {type(e).__name__}: {e}"[:300])
        return None


def _areal_fns():
    """AReaL's own log-prob functions as its FSDP actor calls them (``areal.utils.functional``: 1024-row
    chunks of a ``torch.compile``'d log_softmax + gather, compiled at AReaL's import)."""
    B.require("areal")
    try:
        from areal.utils.functional import gather_logprobs, gather_logprobs_entropy
    except Exception as e:
        raise B.Unavailable(f"areal.utils.functional not importable ({type(e).__name__}: {e})"[:240])
    return gather_logprobs, gather_logprobs_entropy


AREAL_NAME = "areal.utils.functional.gather_logprobs (AReaL {v}, torch.compile'd at import)"
AREAL_ENT_NAME = "areal.utils.functional.gather_logprobs_entropy (AReaL {v}, torch.compile'd at import)"
LIGER_FLCE = ("liger_kernel.transformers.LigerFusedLinearCrossEntropyLoss (reduction='none', lm_head GEMM fused, "
              "temperature 1)")
FLCE_T = (1024, 4096)
FLCE_HIDDEN = 2560  # Qwen3-4B


def _areal_version():
    from areal_tik_plugin.contract.baselines import versions

    return versions().get("areal")


def run_bench(rec, quick: bool = False) -> None:
    """Ours vs AReaL's own compiled ``gather_logprobs`` / ``gather_logprobs_entropy`` (forward, and the
    training forward+backward); the uncompiled torch chunked path as context. Liger's fused linear
    cross-entropy (which includes the lm_head GEMM) against ours after cuBLAS's lm_head, at temperature 1."""
    torch.manual_seed(0)
    ratios, rows, rows_ent, rows_train = {}, [], [], []
    temp = 0.7
    v = _areal_version()
    for T in (QUICK_BENCH_T if quick else BENCH_T):
        x, tok = _data(T, seed=T)
        base = B.collect(rec, "logprob", {AREAL_NAME.format(v=v): lambda: (lambda f=_areal_fns()[0]: f(x, tok, temp))})
        nbytes = T * VOCAB * 2 + T * 16
        row = B.compare(rec, f"logprob[T{T}]", lambda: token_logprobs(x, tok, temp), base,
                        {"eager_torch_chunked (AReaL's code uncompiled)": lambda: _areal_chunked(x, tok, temp)},
                        T=T, V=VOCAB, bytes=nbytes)
        ours = row["ours"]
        if T >= 4096:  # >= 1.2 GB: one copy (the same-buffer replay already streams from HBM)
            streamed(rec, "logprob/ours", ours, nbytes,
                     lambda i: (lambda x=copy_of(x, i), tok=tok: token_logprobs(x, tok, temp)))
        row["ours_bw"] = bw = tbps(nbytes, ours)
        if bw:
            row["ours_share"] = B.shares(bw.get("graph_tbps"), B.measured_copy_tbps())
        rows.append(row)
        # the trainer's call when it logs the entropy
        base = B.collect(rec, "logprob_entropy",
                         {AREAL_ENT_NAME.format(v=v): lambda: (lambda f=_areal_fns()[1]: f(x, tok, temp))})
        row_e = B.compare(rec, f"logprob_entropy[T{T}]", lambda: token_logprobs(x, tok, temp, return_entropy=True),
                          base, None, T=T, V=VOCAB, bytes=nbytes)
        bw_ent = tbps(nbytes, row_e["ours"])
        row_e["ours_bw"] = bw_ent
        rows_ent.append(row_e)
        if T >= 4096:
            add_shares(ratios, bw, T)
            if bw_ent and bw_ent.get("graph_tbps"):
                ratios.setdefault("hbm_frac_T4096plus_graph_with_entropy", []).append(
                    bw_ent["graph_tbps"] / B.HBM_SPEC_TBPS)
        if T in (1024, 4096):
            xr = x.clone().requires_grad_()
            gl = torch.randn(T, device=DEV)

            def ours_train():
                xr.grad = None
                (token_logprobs(xr, tok, temp) * gl).sum().backward()

            def areal_train():
                f = _areal_fns()[0]

                def run():
                    xr.grad = None
                    (f(xr, tok, temp) * gl).sum().backward()
                return run

            def eager_train():
                xr.grad = None
                (_areal_chunked(xr, tok, temp) * gl).sum().backward()

            base = B.collect(rec, "logprob_train", {AREAL_NAME.format(v=v): areal_train})
            rows_train.append(B.compare(rec, f"logprob_train_fwd_bwd[T{T}]", ours_train, base,
                                        {"eager_torch_chunked (AReaL's code uncompiled)": eager_train},
                                        graph=False, T=T, V=VOCAB))
            xr = None
        x = None  # noqa: F841 -- frees this T's logits before the next T's
        torch.cuda.empty_cache()
    rows_flce = _bench_flce(rec, quick)
    B.summarize(rec, rows)
    B.summarize(rec, rows_ent, prefix="entropy.")
    B.summarize(rec, rows_train, prefix="train_fwd_bwd.")
    B.summarize(rec, rows_flce, prefix="fused_linear_train_fwd_bwd.")
    for k, vals in ratios.items():
        rec.summarize(k, vals)


def _bench_flce(rec, quick):
    """Training forward+backward of lm_head + per-token log-prob: ours = cuBLAS ``F.linear`` then our
    log-prob kernel; Liger's fused linear cross-entropy (chunked GEMM + CE in one op, per-token loss =
    -log-prob) where Liger is importable."""
    rows = []
    for T in FLCE_T[:1] if quick else FLCE_T:
        g = torch.Generator(device=DEV).manual_seed(T)
        h = (torch.randn(T, FLCE_HIDDEN, device=DEV, generator=g)).to(torch.bfloat16).requires_grad_()
        W = (torch.randn(VOCAB, FLCE_HIDDEN, device=DEV, generator=g) * 0.02).to(torch.bfloat16).requires_grad_()
        tok = torch.randint(0, VOCAB, (T,), device=DEV, generator=g)

        def ours():
            h.grad = W.grad = None
            token_logprobs(torch.nn.functional.linear(h, W), tok, 1.0).sum().backward()

        def liger_fn():
            B.liger()
            from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

            loss = LigerFusedLinearCrossEntropyLoss(reduction="none")

            def run():
                h.grad = W.grad = None
                (-loss(W, h, tok)).sum().backward()
            return run

        base = B.collect(rec, "logprob_flce", {LIGER_FLCE: liger_fn})
        rows.append(B.compare(rec, f"fused_linear_logprob_train[T{T}/H{FLCE_HIDDEN}]", ours, base, None,
                              graph=False, T=T, H=FLCE_HIDDEN, V=VOCAB))
        h = W = None  # noqa: F841
        torch.cuda.empty_cache()
    return rows

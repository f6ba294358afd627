"""benchmarks/probes/attn_cudnn_bwd_probe.py on the CPU: its LSE conversion is tik_v16's, its fp32 reference is the
gradient of causal GQA attention, and it refuses clearly without a GPU."""

from __future__ import annotations

import pathlib

import torch

from areal_tik_plugin.runtime import loader
from tests.helpers.scripts import load_script

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_lse_conversion_is_the_implementations():
    probe = load_script("attn_cudnn_bwd_probe")
    att = loader.load_implementation(str(ROOT / "kernels" / "tik_v16")).module("attention")
    lse2 = torch.randn(32, 37)
    assert torch.equal(probe.lse_natural(lse2), att.cudnn_stats(lse2)[..., 0])


def test_reference_is_the_gradient_of_causal_gqa_attention():
    probe = load_script("attn_cudnn_bwd_probe")
    g = torch.Generator().manual_seed(1)
    lens, hq, hkv, d = [5, 3], probe.HQ, probe.HKV, 8
    q, k, v, do = (torch.randn(sum(lens), h, d, generator=g, dtype=torch.float64) for h in (hq, hkv, hkv, hq))
    got = probe.reference(q, k, v, do, lens, 0.5)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    outs, s = [], 0
    for n in lens:   # the same attention written out: softmax(q k^T * scale + causal mask) v, K/V heads repeated
        kk = kr[s:s + n].repeat_interleave(hq // hkv, 1)
        vv = vr[s:s + n].repeat_interleave(hq // hkv, 1)
        sc = torch.einsum("ihd,jhd->hij", qr[s:s + n], kk) * 0.5
        sc = sc.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        outs.append(torch.einsum("hij,jhd->ihd", sc.softmax(-1), vv))
        s += n
    want = torch.autograd.grad(torch.cat(outs), (qr, kr, vr), do)
    for a, b in zip(got, want):
        assert torch.allclose(a.double(), b, rtol=1e-4, atol=1e-5)


def test_needs_cuda(capsys, tmp_path):
    probe = load_script("attn_cudnn_bwd_probe")
    if not torch.cuda.is_available():
        assert probe.main(["--out", str(tmp_path)]) == 2
        assert "needs a CUDA device" in capsys.readouterr().err


def test_repeat_bits_counts_the_runs_that_differ():
    probe = load_script("attn_cudnn_bwd_probe")
    g = [torch.randn(7, 3, dtype=torch.bfloat16) for _ in range(3)]
    assert probe.repeat_bits(lambda: g, n=4) == {"runs": 4, "differ_dq_dk_dv": [0, 0, 0]}
    calls = []

    def drifting():  # dk one ulp off on every other call
        calls.append(1)
        dk = g[1].view(torch.int16) ^ (len(calls) % 2)
        return g[0], dk.view(torch.bfloat16), g[2]

    assert probe.repeat_bits(drifting, n=5) == {"runs": 5, "differ_dq_dk_dv": [0, 2, 0]}

    def refused():
        raise RuntimeError("no cuDNN here")

    assert "no cuDNN here" in probe.repeat_bits(refused)["error"]

"""GPU probe: the training step's attention backward through cuDNN, fed by our forward.

The contract binds the forward only (rollout log-probs == training forward log-probs); the gradient has no
bit contract, only accuracy. This probe asks whether cuDNN's backward, given our O and our LSE, is a correct
and faster backward than ours on the training cells of the attention benchmark (Hq 32, Hkv 8, D 128, bf16,
causal, packed sequences):

* ``varlen``: ``aten._cudnn_attention_backward`` on the packed [T, H, D] tensors with cu_seqlens (cuDNN's
  ragged layout), any sequence lengths;
* ``dense``: ``aten._scaled_dot_product_cudnn_attention_backward`` on [B, H, L, D] views of the packed
  tensors (no copy), sequences of one length only.

Accuracy: dq / dk / dv of each against an fp32 reference (fp32 SDPA math on the same bf16 inputs), at odd
lengths, beside our own backward's error. Timing (cold, ``areal_tik_plugin.bench``): our forward + our
backward, our forward + each cuDNN backward, and torch SDPA cuDNN fwd+bwd (the benchmark's strongest
baseline) in the same process. Determinism: each backward repeated on its inputs (``repeat_*``: runs whose dq /
dk / dv bits differ from the first), cuDNN's also under ``torch.use_deterministic_algorithms(True)``.

    python -m benchmarks.probes.attn_cudnn_bwd_probe --out DIR
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

LN2 = math.log(2.0)
HQ, HKV, D = 32, 8, 128
TIMED = ((1, 1152), (4, 4224), (1, 16512))
REPEATS = 8



def _cu(lens, dev):
    c = [0]
    for n in lens:
        c.append(c[-1] + n)
    return torch.tensor(c, device=dev, dtype=torch.int32)


def lse_natural(lse2: torch.Tensor) -> torch.Tensor:
    """Our LSE [Hq, T] in log2 units of the scaled scores -> natural log, [T, Hq] contiguous."""
    return (lse2 * LN2).t().contiguous()


def cudnn_varlen_bwd(do, q, k, v, o, lse2, cu, max_len, scale):
    """cuDNN's ragged backward; its statistics are [T, H, 1] (the layout its own ragged forward returns)."""
    lse = lse_natural(lse2).unsqueeze(-1)
    seed = torch.zeros((), dtype=torch.int64, device=q.device)
    off = torch.zeros((), dtype=torch.int64, device=q.device)
    # None: an undefined tensor, the only "no bias" of the op (a defined empty one is indexed as a bias)
    return torch.ops.aten._cudnn_attention_backward(do, q, k, v, o, lse, seed, off, None, cu, cu, max_len, max_len,
                                                    0.0, True, scale=scale)


def cudnn_dense_bwd(do, q, k, v, o, lse2, B, L, scale):
    def bhld(x):
        return x.view(B, L, x.shape[1], x.shape[2]).transpose(1, 2)
    lse = (lse2 * LN2).view(HQ, B, L).permute(1, 0, 2).contiguous().unsqueeze(-1)
    seed = torch.zeros((), dtype=torch.int64, device=q.device)
    off = torch.zeros((), dtype=torch.int64, device=q.device)
    # undefined bias and cu_seqlens: the dense path (a defined cum_seq_q selects the ragged one)
    dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        bhld(do), bhld(q), bhld(k), bhld(v), bhld(o), lse, seed, off, None, None, None, L, L, 0.0, True,
        scale=scale)
    def back(x):
        return x.transpose(1, 2).reshape(B * L, x.shape[1], x.shape[3])
    return back(dq), back(dk), back(dv)


def reference(q, k, v, do, lens, scale):
    """fp32 SDPA per sequence on the bf16 inputs -> dq, dk, dv (fp32)."""
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    outs = []
    s = 0
    for n in lens:
        qs = qf[s:s + n].transpose(0, 1)
        ks = kf[s:s + n].transpose(0, 1).repeat_interleave(HQ // HKV, 0)
        vs = vf[s:s + n].transpose(0, 1).repeat_interleave(HQ // HKV, 0)
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale).transpose(0, 1))
        s += n
    o = torch.cat(outs)
    return torch.autograd.grad(o, (qf, kf, vf), do.float())


def repeat_bits(fn, n=REPEATS):
    """Run ``fn`` (-> dq, dk, dv) n times on its inputs: how many runs differ from the first, per gradient."""
    try:
        first = [g.clone() for g in fn()]
        differ = [0, 0, 0]
        for _ in range(n - 1):
            for i, g in enumerate(fn()):
                differ[i] += int(not torch.equal(g.view(torch.int16), first[i].view(torch.int16)))
        return {"runs": n, "differ_dq_dk_dv": differ}
    except Exception as e:  # noqa: BLE001
        return {"runs": n, "error": repr(e)[:800]}


def err(x, ref):
    d = (x.float() - ref).abs()
    return {"max_abs": float(d.max()), "rel_l2": float(d.norm() / ref.norm().clamp_min(1e-30))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("attn_cudnn_bwd_probe needs a CUDA device (cuDNN's attention has no CPU kernels)", file=sys.stderr)
        return 2
    from areal_tik_plugin import bench
    from areal_tik_plugin.ops.attention import attention_varlen
    from areal_tik_plugin.runtime.loader import get_implementation
    impl = get_implementation()
    att = impl.module("attention")
    dev = "cuda"
    torch.manual_seed(0)
    scale = D ** -0.5
    rec = {"implementation": impl.name, "source_hash": impl.source_hash, "device": torch.cuda.get_device_name(),
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "accuracy": [], "timing": [],
           "backward_knob": getattr(att, "BACKWARD", None), "errors": []}
    t0 = time.time()

    def ours_fwd(q, k, v, cu, L):
        return att.prefill(q, k, v, cu, L, scale, return_lse=True)

    # accuracy, odd lengths (varlen) and one-length batches (dense)
    for lens in ([257, 130], [300, 300, 300], [1024]):
        T = sum(lens)
        q, k, v = (torch.randn(T, h, D, device=dev, dtype=torch.bfloat16) for h in (HQ, HKV, HKV))
        do = torch.randn(T, HQ, D, device=dev, dtype=torch.bfloat16)
        cu = _cu(lens, dev)
        L = max(lens)
        o, lse2 = ours_fwd(q, k, v, cu, L)
        ref = reference(q, k, v, do, lens, scale)
        row = {"lens": lens, "ours": None}
        try:
            g = att.prefill_backward(do, q, k, v, o, lse2, cu, L, scale)
            row["ours"] = [err(a, b) for a, b in zip(g, ref)]
        except Exception as e:  # noqa: BLE001
            row["ours_error"] = repr(e)
        try:
            g = cudnn_varlen_bwd(do, q, k, v, o, lse2, cu, L, scale)
            torch.cuda.synchronize()
            row["cudnn_varlen"] = [err(a, b) for a, b in zip(g, ref)]
        except Exception as e:  # noqa: BLE001
            row["cudnn_varlen_error"] = repr(e)[:800]
        if len(set(lens)) == 1:
            try:
                g = cudnn_dense_bwd(do, q, k, v, o, lse2, len(lens), L, scale)
                torch.cuda.synchronize()
                row["cudnn_dense"] = [err(a, b) for a, b in zip(g, ref)]
            except Exception as e:  # noqa: BLE001
                row["cudnn_dense_error"] = repr(e)[:800]
        # the forward cuDNN itself would give on the ragged layout: its LSE's shape tells its stats layout
        try:
            r = torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, L, L, True, 0.0, True, scale=scale)
            row["cudnn_varlen_fwd"] = {"o": list(r[0].shape), "lse": list(r[1].shape), "lse_stride": list(r[1].stride()),
                                       "o_vs_ours_max_abs": float((r[0].float() - o.float()).abs().max()),
                                       "lse_vs_ours": float((r[1].reshape(-1) - lse_natural(lse2).reshape(-1)).abs().max())
                                       if r[1].numel() == lse2.numel() else None}
        except Exception as e:  # noqa: BLE001
            row["cudnn_varlen_fwd_error"] = repr(e)[:800]
        rec["accuracy"].append(row)

    # timing on the benchmark's training cells
    for Bn, L in TIMED:
        T = Bn * L
        q, k, v = (torch.randn(T, h, D, device=dev, dtype=torch.bfloat16).requires_grad_() for h in (HQ, HKV, HKV))
        do = torch.randn(T, HQ, D, device=dev, dtype=torch.bfloat16)
        cu = _cu([L] * Bn, dev)
        row = {"B": Bn, "L": L}

        def ours_fb():
            o = attention_varlen(q, k, v, cu, L)
            return torch.autograd.grad(o, (q, k, v), do)

        qd, kd, vd = q.detach(), k.detach(), v.detach()

        def fb_varlen():
            o, lse2 = ours_fwd(qd, kd, vd, cu, L)
            return cudnn_varlen_bwd(do, qd, kd, vd, o, lse2, cu, L, scale)

        def fb_dense():
            o, lse2 = ours_fwd(qd, kd, vd, cu, L)
            return cudnn_dense_bwd(do, qd, kd, vd, o, lse2, Bn, L, scale)

        def fwd_only():
            return ours_fwd(qd, kd, vd, cu, L)

        def fb_triton():  # the Triton backward of an implementation whose BACKWARD knob picks cuDNN
            o, lse2 = ours_fwd(qd, kd, vd, cu, L)
            knob = getattr(att, "BACKWARD", None)
            att.BACKWARD = "triton"
            try:
                return att.prefill_backward(do, qd, kd, vd, o, lse2, cu, L, scale)
            finally:
                if knob is None:
                    del att.BACKWARD
                else:
                    att.BACKWARD = knob

        qs, ks, vs = (torch.randn(Bn, h, L, D, device=dev, dtype=torch.bfloat16).requires_grad_() for h in (HQ, HKV, HKV))
        dos = torch.randn(Bn, HQ, L, D, device=dev, dtype=torch.bfloat16)

        def sdpa_cudnn():
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
            return torch.autograd.grad(o, (qs, ks, vs), dos)

        # the same call again on the same inputs: a policy update must replay (the contract's grad_repeat checks);
        # PyTorch lists its cuDNN attention backward as nondeterministic (pytorch/pytorch#182551)
        for name, fn in (("triton", fb_triton), ("cudnn_varlen", fb_varlen)):
            row[f"repeat_{name}"] = repeat_bits(fn)
        if not torch.are_deterministic_algorithms_enabled():
            torch.use_deterministic_algorithms(True)
            try:
                row["repeat_cudnn_varlen_deterministic_mode"] = repeat_bits(fb_varlen)
            finally:
                torch.use_deterministic_algorithms(False)
        for name, fn in (("ours_fwd_bwd", ours_fb), ("ours_fwd", fwd_only), ("ours_fwd+triton_bwd", fb_triton), ("ours_fwd+cudnn_varlen_bwd", fb_varlen),
                         ("ours_fwd+cudnn_dense_bwd", fb_dense), ("torch SDPA cuDNN fwd+bwd", sdpa_cudnn)):
            try:
                row[name] = bench.time_cold_us(fn)
            except Exception as e:  # noqa: BLE001
                row[name] = None
                row[name + "_error"] = repr(e)[:800]
        rec["timing"].append(row)
        q = k = v = qs = ks = vs = None  # noqa: F841
        torch.cuda.empty_cache()
    rec["seconds"] = time.time() - t0
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"attn_cudnn_bwd_probe-{impl.name}.json")
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)
    for row in rec["accuracy"]:
        print("accuracy", row["lens"], {k: ([round(e["rel_l2"], 5) for e in v] if isinstance(v, list) else v)
                                        for k, v in row.items() if k != "lens"})
    print(f"{'cell':12} {'ours f+b':>10} {'ours f':>9} {'f+triton':>9} {'f+cudnn varlen':>15} {'f+cudnn dense':>14} {'cuDNN f+b':>10}")
    for r in rec["timing"]:
        def fmt(x):
            return f"{x:.1f}" if x else "-"
        print(f"b{r['B']}_L{r['L']:<7} {fmt(r['ours_fwd_bwd']):>10} {fmt(r['ours_fwd']):>9} "
              f"{fmt(r['ours_fwd+triton_bwd']):>9} {fmt(r['ours_fwd+cudnn_varlen_bwd']):>15} {fmt(r['ours_fwd+cudnn_dense_bwd']):>14} "
              f"{fmt(r['torch SDPA cuDNN fwd+bwd']):>10}")
    for r in rec["timing"]:
        print(f"repeats b{r['B']}_L{r['L']}:", {k[7:]: v.get("differ_dq_dk_dv", v.get("error")) for k, v in r.items()
                                                if k.startswith("repeat_")})
    print(f"{rec['seconds']:.0f} s -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU probe: an implementation's Gluon prefill (``--impl``, default tik_v4; sm_90: attention_gluon,
explicit async wgmma) against tik_v2's (Triton, TMA K/V) on the same inputs: output and LSE bits, and
time beside cuDNN SDPA. A knob set with ``tile=128`` runs at the contract's coupled 128-key tile and is
checked against the same implementation's Triton kernel at that tile (``gluon=False``): the bits a
contract with ATTN_KV_TILE 128 would have; its Triton time is reported beside it.

Bits: packed varlen batches with odd lengths (1, 17, 70, 33, 511, 513, 1000, 2049), GQA 32 / 8 at D 128
and 8 / 2 at D 64, bf16 and fp16, and K / V as strided views of one fused QKV tensor; each case says
whether the implementation took its Gluon path (``attention_gluon.applies``) and whether
``prefill(return_lse=True)`` gives the reference bits (int16 / int32 views). Time: the quick spec's prefill cells (Hq 32, Hkv 8, D 128,
bf16), CUDA events, median of ``--iters`` calls after two warm-ups, for each knob set, tik_v2 and
``F.scaled_dot_product_attention`` under ``SDPBackend.CUDNN_ATTENTION`` (causal, GQA) on [B, H, L, D].

    python benchmarks/probes/gluon_prefill_probe.py [--impl tik_v5] [--configs 'order=1;tile=128'] --json $OUT/g.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIT_LENS = (1, 17, 70, 33, 511, 513, 1000, 2049)
CELLS = ((1, 1024), (1, 4096), (1, 8192), (4, 1024), (4, 4096), (4, 8192), (8, 1024), (8, 4096), (16, 1024),
         (16, 4096))
# one packed batch of RL-rollout-like lengths (prompt + response, 96..2047 tokens; 32 sequences, 32 235 tokens):
# the work per query block differs across sequences, which the equal-length cells never show
VARLEN_LENS = (1181, 412, 1910, 733, 96, 1544, 1023, 688, 2047, 301, 1377, 859, 150, 1766, 940, 1205, 517, 1630,
               264, 1098, 1451, 775, 2001, 349, 1289, 606, 1832, 128, 997, 1500, 457, 1109)


IMPL = "tik_v4"


def _mods():
    from areal_tik_plugin.runtime import loader

    k = os.path.join(ROOT, "kernels")
    imp = loader.load_implementation(os.path.join(k, IMPL))
    v2 = loader.load_implementation(os.path.join(k, "tik_v2"))
    return imp.module("attention"), imp.module("attention_gluon"), v2.module("attention")


def parse_configs(text: str, g) -> list[dict]:
    """``'warps=8,k_stages=3;order=1;tile=128'`` -> knob dicts (``tile`` beside the knobs where it is not
    the contract's 64), parsed by compile_gluon_sm90.parse_knob_sets; '' -> [defaults]."""
    from benchmarks.compile_gluon_sm90 import parse_knob_sets

    try:
        out = [dict(kv, **({} if tile == 64 else {"tile": tile})) for kv, tile in parse_knob_sets(text, g)]
    except ValueError as e:
        raise ValueError(f"--configs: {e}")
    names = [_name(kv, g) for kv in out]
    if len(set(names)) != len(names):
        raise ValueError(f"--configs: two knob sets name the same configuration ({names})")
    return out or [{}]


def _knobs(kv: dict) -> dict:
    return {k: v for k, v in kv.items() if k != "tile"}


def _tile(kv: dict) -> int:
    return kv.get("tile", 64)


def _name(kv: dict, g) -> str:
    c = g.config(**_knobs(kv))
    t = ("" if _tile(kv) == 64 else f"t{_tile(kv)}") + ("r" if c.get("rev") else "")
    if c["ws"] and "pp" in c:   # the work-item program: persistent or not, ping-pong or not
        return f"ws-k{c['k_stages']}{t}-p{c['persist']}pp{c['pp']}"
    if c["ws"]:
        return f"ws-k{c['k_stages']}o{c['order']}{t}"
    return f"w{c['warps']}k{c['k_stages']}v{c['v_stages']}o{c['order']}{t}"


def _run(a, q, k, v, cu, mx, scale, kv, **kw):
    """The implementation's prefill with knob set ``kv`` (its Gluon path where ``applies``)."""
    return a.prefill(q, k, v, cu, mx, scale, tile=_tile(kv), gluon_cfg=_knobs(kv), **kw)


def _ref(a, a2, q, k, v, cu, mx, scale, tile, **kw):
    """The reference bits: tik_v2 at the contract's tile, the implementation's Triton kernel at 128."""
    if tile == 64:
        return a2.prefill(q, k, v, cu, mx, scale, **kw)
    return a.prefill(q, k, v, cu, mx, scale, tile=tile, gluon=False, **kw)


def bit_cases(torch, configs):
    a4, g4, a2 = _mods()
    out = []
    for hq, hkv, d, dt, fused in ((32, 8, 128, torch.bfloat16, False), (8, 2, 64, torch.bfloat16, False),
                                  (32, 8, 128, torch.float16, False), (32, 8, 128, torch.bfloat16, True)):
        torch.manual_seed(hq * d + fused)
        lens = torch.tensor(BIT_LENS)
        T = int(lens.sum())
        cu = torch.zeros(len(BIT_LENS) + 1, dtype=torch.int32)
        cu[1:] = lens.cumsum(0)
        cu = cu.cuda()
        if fused:  # one [T, (Hq + 2 Hkv) * D] projection output, q / k / v as views (row stride > H * D)
            qkv = torch.randn(T, (hq + 2 * hkv) * d, device="cuda", dtype=dt)
            q = qkv[:, :hq * d].view(T, hq, d)
            k = qkv[:, hq * d:(hq + hkv) * d].view(T, hkv, d)
            v = qkv[:, (hq + hkv) * d:].view(T, hkv, d)
        else:
            q = torch.randn(T, hq, d, device="cuda", dtype=dt)
            k = torch.randn(T, hkv, d, device="cuda", dtype=dt)
            v = torch.randn(T, hkv, d, device="cuda", dtype=dt)
        scale = d ** -0.5
        mx = max(BIT_LENS)
        refs = {t: _ref(a4, a2, q, k, v, cu, mx, scale, t, return_lse=True) for t in {_tile(kv) for kv in configs}}
        for kv in configs:
            o2, l2 = refs[_tile(kv)]
            o4, l4 = _run(a4, q, k, v, cu, mx, scale, kv, return_lse=True)
            o4n = _run(a4, q, k, v, cu, mx, scale, kv)
            torch.cuda.synchronize()
            out.append({"config": _name(kv, g4), "hq": hq, "hkv": hkv, "d": d, "dtype": str(dt).split(".")[-1],
                        "fused_qkv": fused, "gluon_path": bool(g4.applies(q, k, v, _tile(kv), 512)),
                        "out_bits_equal": bool(torch.equal(o4.view(torch.int16), o2.view(torch.int16))),
                        "lse_bits_equal": bool(torch.equal(l4.view(torch.int32), l2.view(torch.int32))),
                        "out_no_lse_bits_equal": bool(torch.equal(o4n.view(torch.int16), o2.view(torch.int16))),
                        "rows_differing": int((o4.view(torch.int16) != o2.view(torch.int16)).any(-1).any(-1).sum()),
                        "max_abs_diff": float((o4.float() - o2.float()).abs().max())})
    return out


def _time(torch, fn, iters):
    fn(), fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def time_cells(torch, F, iters, configs):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    a4, g4, a2 = _mods()
    hq, hkv, d = 32, 8, 128
    res = []
    for name, lens in [(f"prefill_b{B}_L{n}", [n] * B) for B, n in CELLS] + [("prefill_varlen", list(VARLEN_LENS))]:
        B, n = len(lens), max(lens)
        T = sum(lens)
        torch.manual_seed(T)
        q = torch.randn(T, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(T, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(T, hkv, d, device="cuda", dtype=torch.bfloat16)
        cu = torch.zeros(B + 1, device="cuda", dtype=torch.int32)
        cu[1:] = torch.tensor(lens, device="cuda").cumsum(0)
        scale = d ** -0.5
        t2 = _time(torch, lambda: a2.prefill(q, k, v, cu, n, scale), iters)
        flops = sum(4 * hq * d * x * x / 2 for x in lens)
        tc = None
        if len(set(lens)) == 1:   # cuDNN SDPA on [B, H, L, D]; the varlen cell has tik_v2 as its reference
            q4, k4, v4 = (t.view(B, n, -1, d).transpose(1, 2).contiguous() for t in (q, k, v))

            def cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, enable_gqa=True)

            tc = _time(torch, cudnn, iters)
            del q4, k4, v4
        base = tc if tc is not None else t2
        refs = {t: _ref(a4, a2, q, k, v, cu, n, scale, t).view(torch.int16) for t in {_tile(kv) for kv in configs}}
        row = {"cell": name, "lens": lens if tc is None else None, "tik_v2_us": round(t2, 2),
               "cudnn_us": None if tc is None else round(tc, 2), "v2_vs_cudnn": None if tc is None else round(tc / t2, 3),
               "cudnn_tflops": None if tc is None else round(flops / tc / 1e6, 1), IMPL: {}}
        for t in sorted(refs):
            if t != 64:  # the implementation's Triton kernel at this tile (the reference bits)
                tt = _time(torch, lambda: a4.prefill(q, k, v, cu, n, scale, tile=t, gluon=False), iters)
                row[f"triton_t{t}"] = {"us": round(tt, 2), "vs_cudnn": round(base / tt, 3)}
        for kv in configs:
            t4 = _time(torch, lambda: _run(a4, q, k, v, cu, n, scale, kv), iters)
            same = torch.equal(_run(a4, q, k, v, cu, n, scale, kv).view(torch.int16), refs[_tile(kv)])
            # vs_cudnn: cuDNN's time / ours; in the varlen cell tik_v2's time / ours (no cuDNN run)
            row[IMPL][_name(kv, g4)] = {"us": round(t4, 2), "over_v2": round(t2 / t4, 3),
                                        "vs_cudnn": round(base / t4, 3), "tflops": round(flops / t4 / 1e6, 1),
                                        "bits_equal": bool(same)}
        res.append(row)
        del q, k, v
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/probes/gluon_prefill_probe.py")
    ap.add_argument("--impl", default="tik_v4", help="implementation folder under kernels/ with attention_gluon.py")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--configs", default="", help="';'-separated attention_gluon knob sets, each "
                    "'knob=value,...', tile=128 beside the knobs (default: the defaults only)")
    ap.add_argument("--guard-s", type=float, default=0.0,
                    help="first run each knob set alone on one small batch in a child process with this limit; "
                         "a set that hangs (an mbarrier protocol that never completes) or fails is dropped and "
                         "reported, so it cannot take the rest of the probe with it (0: no guard)")
    ap.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)   # the guard's child
    args = ap.parse_args(argv)
    global IMPL
    if not os.path.isfile(os.path.join(ROOT, "kernels", args.impl, "attention_gluon.py")):
        ap.error(f"--impl: kernels/{args.impl}/attention_gluon.py not found (expected an implementation with a Gluon prefill)")
    IMPL = args.impl
    if args.iters < 1:
        ap.error(f"--iters: expected >= 1, got {args.iters}")
    if args.guard_s < 0:
        ap.error(f"--guard-s: expected >= 0, got {args.guard_s}")
    sys.path.insert(0, ROOT)
    try:
        configs = parse_configs(args.configs, _mods()[1])
    except ValueError as e:
        ap.error(str(e))
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("gluon_prefill_probe: needs a CUDA device", file=sys.stderr)
        return 2
    with open(os.path.join(ROOT, "kernels", IMPL, "manifest.json")) as f:
        src = json.load(f)["source_hash"]   # the loader has checked it against the sources
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "impl": IMPL, "source_hash": src}
    import triton

    res["triton"] = triton.__version__
    if args.smoke:
        return smoke(torch, configs)
    if args.guard_s:
        res["guard"] = guard(configs, args.guard_s)
        configs = [kv for kv, g in zip(configs, res["guard"]) if g["status"] == "ok"]
        if not configs:
            print(json.dumps(res, indent=1))
            print("gluon_prefill_probe: every knob set failed its guard run", file=sys.stderr)
            return 1
    res["configs"] = [_name(kv, _mods()[1]) for kv in configs]
    res["bits"] = bit_cases(torch, configs)
    res["cells"] = time_cells(torch, F, args.iters, configs)
    text = json.dumps(res, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    print("bits vs tik_v2 (tile 128: vs the implementation's Triton kernel) (out, lse, out without lse), rows differing:")
    for c in res["bits"]:
        print(f"  {c['config']} {c['hq']}/{c['hkv']} D{c['d']} {c['dtype']} fused={c['fused_qkv']!s:5s} gluon={c['gluon_path']!s:5s} "
              f"{c['out_bits_equal']},{c['lse_bits_equal']},{c['out_no_lse_bits_equal']} rows {c['rows_differing']}")
    names = res["configs"]
    tri = sorted({k for c in res["cells"] for k in c if k.startswith("triton_t")})
    for g in res.get("guard", []):
        if g["status"] != "ok":
            print(f"dropped {g['config']}: {g['status']} ({g['tail'][-200:]!r})")
    print(f"{'cell':18s} {'v2 us':>8s} {'cudnn':>8s} {'v2/cud':>6s} " + " ".join(f"{n:>11s}" for n in tri + names)
          + f"   ({IMPL} config: cuDNN us / its us, * = bits differ; prefill_varlen: tik_v2 us / its us)")
    geo = {n: 1.0 for n in tri + names}
    g2 = 1.0
    k = 0
    for c in res["cells"]:
        eq = c["cudnn_us"] is not None   # the varlen cell has no cuDNN run and stays out of the geomean
        if eq:
            g2 *= c["v2_vs_cudnn"]
            k += 1
        cells = []
        for n in tri:
            geo[n] *= c[n]["vs_cudnn"] if eq else 1.0
            cells.append(f"{c[n]['vs_cudnn']:10.3f} ")
        for n in names:
            r = c[IMPL][n]
            geo[n] *= r["vs_cudnn"] if eq else 1.0
            cells.append(f"{r['vs_cudnn']:10.3f}{'' if r['bits_equal'] else '*'}")
        cud = f"{c['cudnn_us']:8.1f} {c['v2_vs_cudnn']:6.3f}" if eq else f"{'-':>8s} {'-':>6s}"
        print(f"{c['cell']:18s} {c['tik_v2_us']:8.1f} {cud} " + " ".join(cells))
    print(f"{'geomean vs cuDNN':18s} {'':8s} {'':8s} {g2 ** (1 / k):6.3f} " + " ".join(f"{geo[n] ** (1 / k):11.3f}" for n in tri + names))
    return 0


def _config_text(kv: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in kv.items())


def smoke(torch, configs) -> int:
    """The guard's child: each knob set once on a small packed batch (lengths 1, 70, 513), with and without
    the LSE, synchronized; prints whether the output has tik_v2's bits."""
    a4, g4, a2 = _mods()
    lens = (1, 70, 513)
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    cu = cu.cuda()
    torch.manual_seed(0)
    q, k, v = (torch.randn(sum(lens), h, 128, device="cuda", dtype=torch.bfloat16) for h in (32, 8, 8))
    for kv in configs:
        o, lse = _run(a4, q, k, v, cu, max(lens), 128 ** -0.5, kv, return_lse=True)
        o2 = _ref(a4, a2, q, k, v, cu, max(lens), 128 ** -0.5, _tile(kv))
        torch.cuda.synchronize()
        print(f"smoke {_name(kv, g4)}: bits equal {torch.equal(o.view(torch.int16), o2.view(torch.int16))}")
    return 0


def guard(configs, limit_s: float) -> list[dict]:
    """Each knob set in a child process (``--smoke``) with a wall-clock limit: status ok / timeout / error."""
    import subprocess

    g = _mods()[1]
    out = []
    for kv in configs:
        cmd = [sys.executable, os.path.abspath(__file__), "--impl", IMPL, "--configs", _config_text(kv), "--smoke"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, cwd=ROOT)
            status, tail = ("ok" if r.returncode == 0 else f"error (exit {r.returncode})"), (r.stdout + r.stderr)[-600:]
        except subprocess.TimeoutExpired as e:
            status, tail = f"timeout ({limit_s:.0f} s)", str((e.stdout or b"")[-600:])
        out.append({"config": _name(kv, g), "status": status, "tail": tail})
        print(f"guard {_name(kv, g)}: {status}", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(main())

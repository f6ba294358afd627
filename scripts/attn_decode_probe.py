"""GPU probe: paged decode attention's launch knobs, kernel level (graph replay), against cuDNN SDPA.

Session 20's Nsight Compute run of b1 / ctx 8192 (``scripts/ncu_probe.py``) showed the decode kernel at
1.5 TB/s with 128 programs (0.24 waves), half its warps' cycles stalled on global loads: latency-bound with
one K/V tile in flight per program (``DECODE_STAGES`` 2 = one prefetch buffer). An earlier probe of
``(warps, stages)`` measured whole layer decode steps, where the GEMVs dominate and the spread hid the
attention kernel. This one times the decode op alone (the split kernel + the merge), per variant, in
interleaved rounds, and checks every variant's output bit for bit against the default's (free knobs).

    python scripts/attn_decode_probe.py --out DIR [--cases 1x8192,4x8192,16x4096,64x1024,1x1024] [--rounds 3]
"""

from __future__ import annotations

import sys

from areal_tik_plugin.gpu import probe

# name -> attention.decode overrides (free knobs; DECODE_WARPS / DECODE_STAGES / DECODE_MERGE_IN_LAST)
VARIANTS = {
    "default": {},
    "w4_s1": dict(dec_warps=4, dec_stages=1),
    "w4_s3": dict(dec_warps=4, dec_stages=3),
    "w4_s4": dict(dec_warps=4, dec_stages=4),
    "w8_s2": dict(dec_warps=8, dec_stages=2),
    "w8_s3": dict(dec_warps=8, dec_stages=3),
    "w2_s3": dict(dec_warps=2, dec_stages=3),
    "merge_in_last": dict(merge_in_last=True),
}
MAX_TOKENS = 1 << 20


def parse_cases(text: str) -> list[tuple[int, int]]:
    out = []
    for item in [s for s in text.split(",") if s]:
        try:
            b, ctx = (int(x) for x in item.split("x"))
        except ValueError:
            b = ctx = 0
        if not (1 <= b <= 256 and 1 <= ctx and b * ctx <= MAX_TOKENS):
            raise ValueError(f"--cases: {item!r} is not <B>x<ctx> with 1 <= B <= 256, ctx >= 1, "
                             f"B*ctx <= {MAX_TOKENS}")
        out.append((b, ctx))
    if not out:
        raise ValueError("--cases: expected at least one <B>x<ctx>")
    return out


def main(argv=None) -> int:
    ap = probe.parser("attn_decode_probe", rounds=3)
    ap.add_argument("--cases", default="1x8192,4x8192,16x4096,64x1024,1x1024")
    args, cases = probe.parse(ap, argv, lambda a: parse_cases(a.cases))
    if probe.cuda_missing("attn_decode_probe"):
        return 2
    import torch

    from areal_tik_plugin import bench
    from areal_tik_plugin.gpu.attention import _pool_from_seqs, _rand, _sdpa_decode_fn
    from areal_tik_plugin.gpu.suite import bits
    from areal_tik_plugin.loader import get_implementation

    impl = get_implementation()
    att = impl.module("attention")
    Hq, Hkv, D = 32, 8, 128
    sc = D ** -0.5
    res = dict(probe.new_result(impl), variants=VARIANTS)
    torch.manual_seed(0)
    for B, ctx in cases:
        ks = [_rand(ctx, Hkv, D) for _ in range(B)]
        vs = [_rand(ctx, Hkv, D) for _ in range(B)]
        kp, vp, table, rows = _pool_from_seqs(ks, vs, n_spare=16)
        del ks, vs
        q = _rand(B, Hq, D)
        sl = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
        outs = {v: torch.empty_like(q) for v in VARIANTS}
        fns = {v: (lambda v=v, o=over: att.decode(q, kp, vp, sl, table, rows, sc, 1, ctx, out=outs[v], **o))
               for v, over in VARIANTS.items()}
        row = {"B": B, "ctx": ctx, "mismatch": [], "us": {}}
        for v, fn in fns.items():
            fn()
        torch.cuda.synchronize()
        ref = bits(outs["default"])
        row["mismatch"] = [v for v in VARIANTS if not torch.equal(bits(outs[v]), ref)]
        fns["cudnn_dense"] = _sdpa_decode_fn(B, ctx, Hq, Hkv, D)
        row["us"], row["samples_us"] = bench.interleaved_medians(fns, bench.time_graph_us, args.rounds)
        row["kv_bytes"] = 2 * B * ctx * Hkv * D * 2
        res["rows"].append(row)
        print(f"b{B}/ctx{ctx:<6} " + "  ".join(f"{v} {u:.1f}" for v, u in row["us"].items())
              + f"  mismatches {row['mismatch'] or 0}", flush=True)
        torch.cuda.empty_cache()
    return probe.write_result(res, args.out, "attn_decode_probe.json", "cases")


if __name__ == "__main__":
    sys.exit(main())

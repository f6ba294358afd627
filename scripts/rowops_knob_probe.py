"""GPU probe of free launch knobs: RoPE (token tiles), the KV write (tile, warps) and the token log-prob
(with and without the entropy sums). Graph-replay time (RoPE and the KV write: also over input copies,
streamed from HBM, which gives their ``hbm_frac``) and share of HBM bandwidth per knob value, each output
compared bit for bit with the default knobs' output (a free knob must not change a bit; a mismatch is
reported).

Variants probed and removed (not faster; evidence/probes/): session 15, log-prob partial programs with
several rows and the next row prefetched, a row-major program order, a register cap; session 16
(rowops_knob_probe-tik_v1-e8d0ca06a7a5), a persistent software-pipelined log-prob partial kernel (0.45-0.54
of HBM against 0.58-0.68), the same loop for RoPE's token tiles (slower on 5 of 6 rows), and a KV-write
variant issuing both loads before the stores (within +-4%, no consistent sign); session 22
(rowops_knob_probe-logprob-{HOST_INV,FULL_UNMASKED}-tik_v1-4bd15508154c), a scalar temperature's 1/T computed
on the host instead of a div_rn per partial program, and unmasked loads for every whole chunk: ~25% fewer
instructions on the sm_90 hot path, same bits, share of HBM x0.99-1.01 at T 1024 / 4096 (the kernel is not
issue-bound) and lower, within a wide spread, at T 16384 (on the fma form, session 24, FULL_UNMASKED gained
x1.03-1.04 with the entropy and landed); session 24 (rowops_knob_probe-logprob-NAN_REDO-tik_v1-179ae67469a3), the
entropy sum as e * d without the clamp, the chunk reloaded and summed with it only when that gave a NaN: 96
registers instead of 80, x0.92-0.93 with the entropy.

    python scripts/rowops_knob_probe.py --out DIR [--ops rope,kv_write,rope_kv,logprob]

Writes DIR/rowops_knob_probe.json and prints one line per (op, shape, knob). A probe, not evidence: the
contract suite (python -m areal_tik_plugin.gpu) checks whatever knob values land.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

import torch

from areal_tik_plugin import bench
from areal_tik_plugin.gpu._rowops import HBM_TBPS, knobs as knob_values, stream_copies
from areal_tik_plugin.gpu.probe import parse_list
from areal_tik_plugin.gpu.suite import bits

ROPE_MODELS = {"qwen2.5-1.5b": (12, 2), "qwen3-4b": (32, 8), "qwen3-30b-a3b": (32, 4)}
ROPE_T = (4096, 16384)
ROPE_KNOBS = {"TOKEN_TILE_ELEMS": (2048, 4096, 8192), "TOKEN_WARPS": (2, 4), "HEAD_GROUPS": (False, True)}
KV_T = (4096, 16384)
KV_KNOBS = {"TILE_ELEMS": (1024, 2048, 4096, 8192, 16384), "WARPS": (1, 2, 4, 8)}
LOGPROB_T = (1024, 4096, 16384)
LOGPROB_KNOBS = {"MERGE_ROWS": (64, 128, 256), "EVICT_FIRST": (False, True)}
# --logprob-ab KNOB: a log-prob knob off against on (EXP2, the coupled base-2 sums, and SHIFT_FMA, the coupled
# fma form of s - max, change bits by design;
# SELECT_FREE, a free knob, must not), with and without the entropy, interleaved over --rounds rounds; each
# row also carries logp's largest error against an fp64 log_softmax on the first LOGPROB_ACC_ROWS rows
LOGPROB_AB = {"EXP2": "coupled", "SELECT_FREE": "free", "FUSED_SUMS": "free", "SHIFT_FMA": "coupled",
              "FULL_UNMASKED": "free"}
LOGPROB_ACC_ROWS = 64
# --logprob-contract NAME=VALUE[,NAME=VALUE]: the same interleaved A/B for the log-prob's coupled contract
# constants (contract.py: LOGPROB_CHUNK_WARPS, LOGPROB_LOAD_GROUP, LOGPROB_VOCAB_CHUNK), their current values
# against the VALUEs together, set on the contract module for the probe only (bits differ by design)
LOGPROB_CONTRACT = ("LOGPROB_CHUNK_WARPS", "LOGPROB_LOAD_GROUP", "LOGPROB_VOCAB_CHUNK")
VOCAB = 151936
DEV = "cuda"      # the CPU test runs the probes on "cpu" under the Triton interpreter, timings stubbed
OPS = ("rope", "kv_write", "rope_kv", "logprob")


def _sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def _same(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return all(_same(x, y) for x, y in zip(a, b) if x is not None)
    return torch.equal(bits(a), bits(b))


def _share(nbytes, us):
    return nbytes / (us * 1e-6) / 1e12 / HBM_TBPS


def _probe(rows, mod, base, combos, nbytes, ref, run, copy_calls, call=None):
    """Per knob combination of ``mod``: ``run()``'s output against ``ref`` bit for bit, the graph time of
    ``call`` (default ``run``) on the same buffers and of ``copy_calls`` (one call per input copy, streamed
    from HBM), and the shares of HBM bandwidth; one row each into ``rows``."""
    for kn in combos:
        row = dict(base, knobs=kn or "default")
        try:
            with knob_values(mod, **kn):
                out = run()
                _sync()
                same = _same(out, ref)
                us = bench.time_graph_us(call or run)
                st = bench.time_graph_each_us(copy_calls)
            row.update(us=us, hbm_frac_same_buffers=_share(nbytes, us), streamed_us=st,
                       stream_copies=len(copy_calls), hbm_frac=_share(nbytes, st), bits_equal_default=same)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(row)
        _print(row)


def probe_rope(impl, rows):
    rope = impl.module("rope")
    for (model, (hq, hkv)), T in itertools.product(ROPE_MODELS.items(), ROPE_T):
        d = 128
        g = torch.Generator(device=DEV).manual_seed(T)
        q = torch.randn(T, hq, d, device=DEV, generator=g).to(torch.bfloat16)
        k = torch.randn(T, hkv, d, device=DEV, generator=g).to(torch.bfloat16)
        pos = torch.randint(0, 32768, (T,), device=DEV, generator=g)
        inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=DEV, dtype=torch.float32) / d))
        nbytes = 2 * T * (hq + hkv) * d * 2 + T * 8
        ref = rope.forward(q, k, pos, inv)
        copies = [(q, k)] + [(q.clone(), k.clone()) for _ in range(stream_copies(nbytes) - 1)]
        combos = [dict()] + [dict(zip(ROPE_KNOBS, v)) for v in itertools.product(*ROPE_KNOBS.values())]
        _probe(rows, rope, {"op": "rope", "model": model, "T": T}, combos, nbytes, ref,
               run=lambda: rope.forward(q, k, pos, inv),
               copy_calls=[lambda q=q_, k=k_: rope.forward(q, k, pos, inv) for q_, k_ in copies])
        del q, k, copies


ROPE_KV_KNOBS = {"KV_TOKEN_TILES": (False, True), "TOKEN_TILE_ELEMS": (4096, 8192)}
ROPE_KV_SLOTS = 1 << 18


def probe_rope_kv(impl, rows):
    """RoPE + KV-pool write in one launch (SGLang's fused set_kv_buffer): the head-block kernel against the
    token-tile kernel (KV_TOKEN_TILES), q / k / v as strided views of one fused QKV output, T tokens at
    random slots of a 2^18-slot pool; streamed copies write other slots."""
    rope = impl.module("rope")
    slots = ROPE_KV_SLOTS
    for (model, (hq, hkv)), T in itertools.product(ROPE_MODELS.items(), ROPE_T):
        d = 128
        g = torch.Generator(device=DEV).manual_seed(T)
        inv = 1.0 / (1e6 ** (torch.arange(0, d, 2, device=DEV, dtype=torch.float32) / d))
        pos = torch.randint(0, 32768, (T,), device=DEV, generator=g)
        kc = torch.zeros(slots, hkv, d, device=DEV, dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        nbytes = 2 * T * (hq + 2 * hkv) * d * 2 + T * 16

        def views(qkv):
            return (qkv[:, :hq * d].view(T, hq, d), qkv[:, hq * d:(hq + hkv) * d].view(T, hkv, d),
                    qkv[:, (hq + hkv) * d:].view(T, hkv, d))

        copies = [(torch.randn(T, (hq + 2 * hkv) * d, device=DEV, generator=g).to(torch.bfloat16),
                   torch.randperm(slots - 1, device=DEV, generator=g)[:T] + 1)
                  for _ in range(stream_copies(nbytes))]
        q, k, v = views(copies[0][0])
        loc = copies[0][1]

        def run():
            kc.zero_()
            vc.zero_()
            return rope.forward_kv_write(q, k, v, pos, inv, 1.0, kc, vc, loc), kc, vc

        ref = tuple(t.clone() for t in run())
        combos = [dict()] + [dict(zip(ROPE_KV_KNOBS, vals)) for vals in itertools.product(*ROPE_KV_KNOBS.values())]
        _probe(rows, rope, {"op": "rope_kv", "model": model, "T": T}, combos, nbytes, ref, run=run,
               call=lambda: rope.forward_kv_write(q, k, v, pos, inv, 1.0, kc, vc, loc),
               copy_calls=[lambda qkv=qkv, lc=lc: rope.forward_kv_write(*views(qkv), pos, inv, 1.0, kc, vc, lc)
                           for qkv, lc in copies])
        del kc, vc, copies


def probe_kv_write(impl, rows):
    """KV write (SGLang set_kv_buffer) tile / warp knobs: T new tokens' K and V rows into a 65536-slot pool
    at random slots; share of HBM over the bytes moved (read k, v; write the pool rows)."""
    kv = impl.module("kv_write")
    slots = 65536
    for (model, (_hq, hkv)), T in itertools.product(ROPE_MODELS.items(), KV_T):
        d = 128
        g = torch.Generator(device=DEV).manual_seed(T)
        kc = torch.zeros(slots, hkv, d, device=DEV, dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        k = torch.randn(T, hkv, d, device=DEV, generator=g).to(torch.bfloat16)
        v = torch.randn(T, hkv, d, device=DEV, generator=g).to(torch.bfloat16)
        loc = torch.randperm(slots, device=DEV, generator=g)[:T]
        nbytes = 4 * T * hkv * d * 2 + T * 8
        kv.forward(kc, vc, loc, k, v)
        ref = (kc.clone(), vc.clone())
        # streamed: other rows at other slots per copy (every copy writes different pool memory)
        copies = [(k, v, loc)] + [(k.clone(), v.clone(), torch.randperm(slots, device=DEV, generator=g)[:T])
                                  for _ in range(stream_copies(nbytes) - 1)]
        combos = [dict()] + [dict(zip(KV_KNOBS, vals)) for vals in itertools.product(*KV_KNOBS.values())]

        def write_fresh():
            kc.zero_()
            vc.zero_()
            kv.forward(kc, vc, loc, k, v)
            return kc, vc

        _probe(rows, kv, {"op": "kv_write", "model": model, "T": T}, combos, nbytes, ref, run=write_fresh,
               call=lambda: kv.forward(kc, vc, loc, k, v),
               copy_calls=[lambda k=k_, v=v_, loc=l_: kv.forward(kc, vc, loc, k, v) for k_, v_, l_ in copies])
        del kc, vc, k, v, copies


def contract_label(contract: dict) -> str:
    """The row knob of a --logprob-contract A/B: ``NAME=VALUE[,NAME=VALUE]`` (False: the contract's values, True:
    the VALUEs)."""
    return ",".join(f"{k}={v}" for k, v in contract.items())


def probe_logprob(impl, rows, ab=None, rounds=1, contract=None, ts=None):
    """``ab``: a log-prob module knob off / on; ``contract``: {NAME: VALUE} of contract constants, the current
    values (row knob ``NAME=VALUE[,...]`` False) against the VALUEs (True); ``ts``: row counts (LOGPROB_T)."""
    lp = impl.module("logprob")
    if contract:
        ab = contract_label(contract)
    for T in ts or LOGPROB_T:
        g = torch.Generator(device=DEV).manual_seed(T)
        x = (torch.randn(T, VOCAB, device=DEV, generator=g) * 4).to(torch.bfloat16)
        tok = torch.randint(0, VOCAB, (T,), device=DEV, generator=g)
        nbytes = T * VOCAB * 2 + T * 16
        ref = lp.forward(x, tok, 0.7)
        n_acc = min(T, LOGPROB_ACC_ROWS)
        ref64 = torch.log_softmax(x[:n_acc].double() / 0.7, -1).gather(-1, tok[:n_acc, None])[:, 0]
        if ab:
            combos = [{"entropy": e, ab: b} for _ in range(rounds) for b in (False, True) for e in (False, True)]
        else:
            combos = [dict(entropy=e) for e in (True, False)]
            combos += [dict(kn, entropy=False) for kn in
                       [dict(zip(LOGPROB_KNOBS, v)) for v in itertools.product(*LOGPROB_KNOBS.values())]]
        for combo in combos:
            kn = {k: v for k, v in combo.items() if k != "entropy"}
            ent = combo["entropy"]
            mod = lp
            if contract:
                mod, kn = lp.C, (dict(contract) if combo[ab] else {})
            try:
                with knob_values(mod, **kn):
                    out = lp.forward(x, tok, 0.7, entropy=ent)
                    _sync()
                    same = _same(out, ref)  # entropy=False: logp and lse (the entropy slot is None)
                    err = float((out[0][:n_acc].double() - ref64).abs().max())
                    us = bench.time_graph_us(lambda: lp.forward(x, tok, 0.7, entropy=ent), n_inner=3)
                    row = {"op": "logprob", "T": T, "knobs": combo, "us": us,
                           "hbm_frac": _share(nbytes, us), "bits_equal_default": same, "logp_max_abs_err": err}
            except Exception as e:
                row = {"op": "logprob", "T": T, "knobs": combo, "error": f"{type(e).__name__}: {e}"[:200]}
            rows.append(row)
            _print(row)
        del x


def _print(row):
    shape = f"{row.get('model', '')} T={row['T']}"
    if "error" in row:
        print(f"{row['op']:<8}{shape:<24}{str(row['knobs']):<52} ERROR {row['error']}", flush=True)
    else:
        us = row.get("streamed_us", row["us"])
        print(f"{row['op']:<8}{shape:<24}{str(row['knobs']):<52}{us:9.1f} us  hbm {row['hbm_frac']:.3f}"
              f"  bits {'=' if row['bits_equal_default'] else 'DIFFER'}", flush=True)


def _print_best(rows):
    """One line per (op, shape): the default knobs' share of HBM and the best knob values'."""
    print("best per shape (share of HBM; default -> best):")
    shapes: dict = {}
    for r in rows:
        if "error" not in r:
            shapes.setdefault((r["op"], r.get("model", ""), r["T"]), []).append(r)
    for (op, model, T), rs in shapes.items():
        dflt = next((r for r in rs if r["knobs"] in ("default", {"entropy": False})), rs[0])
        best = max(rs, key=lambda r: r["hbm_frac"])
        print(f"  {op:<8}{model + ' T=' + str(T):<24}{dflt['hbm_frac']:.3f} -> {best['hbm_frac']:.3f} {best['knobs']}")


def unexpected_mismatches(rows, coupled_now):
    """Rows whose output differs from the default's although no coupled knob (``coupled_now``: name ->
    the module's current value) was moved away from its current value: a free knob that changed bits."""
    return [r for r in rows if r.get("bits_equal_default") is False
            and not (isinstance(r["knobs"], dict) and any(r["knobs"].get(k, v) != v for k, v in coupled_now.items()))]


def _print_ab(rows, ab):
    """Median HBM share per (T, entropy) of knob ``ab`` off / on over the rounds, and logp's largest error."""
    print(f"log-prob {ab} (median share of HBM over the rounds; logp max |err| vs fp64):")
    for T in sorted({r["T"] for r in rows if r["op"] == "logprob"}):
        for ent in (False, True):
            cell = {}
            for b in (False, True):
                rs = [r for r in rows if r["op"] == "logprob" and r["T"] == T and "error" not in r
                      and r["knobs"].get(ab) is b and r["knobs"]["entropy"] is ent]
                if rs:
                    cell[b] = (statistics.median(r["hbm_frac"] for r in rs), max(r["logp_max_abs_err"] for r in rs),
                               len(rs))
            if len(cell) == 2:
                (f0, e0, n), (f1, e1, _) = cell[False], cell[True]
                print(f"  T={T:<6} entropy={str(ent):<6} off {f0:.3f} (err {e0:.1e})  {ab} {f1:.3f} "
                      f"(err {e1:.1e})  x{f1 / f0:.3f}  [{n} rounds]")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python scripts/rowops_knob_probe.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ops", default="rope,kv_write,logprob")
    ap.add_argument("--logprob-ab", default="", metavar="KNOB",
                    help=f"log-prob: KNOB off against on, one of {sorted(LOGPROB_AB)} (EXP2 changes bits by design)")
    ap.add_argument("--logprob-exp2", action="store_true", help="= --logprob-ab EXP2")
    ap.add_argument("--logprob-contract", default="", metavar="NAME=VALUE[,NAME=VALUE]",
                    help=f"log-prob: coupled contract constants at their values against the VALUEs together, "
                         f"NAMEs from {list(LOGPROB_CONTRACT)}")
    ap.add_argument("--logprob-t", default="", metavar="T,T,...",
                    help=f"log-prob row counts (default {','.join(map(str, LOGPROB_T))}; the sampler's calls are 1..256)")
    ap.add_argument("--rounds", type=int, default=3, help="with --logprob-ab: interleaved rounds (>= 1)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: expected >= 1")
    ab = "EXP2" if args.logprob_exp2 else args.logprob_ab
    if ab and ab not in LOGPROB_AB:
        ap.error(f"--logprob-ab {ab!r}: expected one of {sorted(LOGPROB_AB)}")
    ts = None
    if args.logprob_t:
        try:
            ts = parse_list(args.logprob_t, "--logprob-t (row counts)", lo=1, hi=65536)
        except ValueError as e:
            ap.error(str(e))
    contract = None
    if args.logprob_contract:
        contract = {}
        for item in args.logprob_contract.split(","):
            name, _, value = item.partition("=")
            if name not in LOGPROB_CONTRACT or not value.isdigit() or int(value) < 1 or name in contract:
                ap.error(f"--logprob-contract {args.logprob_contract!r}: expected NAME=VALUE[,NAME=VALUE] with each "
                         f"NAME once, one of {list(LOGPROB_CONTRACT)}, and VALUE a positive integer")
            contract[name] = int(value)
        if ab:
            ap.error("--logprob-contract and --logprob-ab: one A/B per run")
        ab = contract_label(contract)
    from areal_tik_plugin.loader import get_implementation

    impl = get_implementation()
    rows: list = []
    t0 = time.time()
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in OPS]
    if unknown or not ops:
        ap.error(f"--ops: expected a comma list of {list(OPS)}, got {args.ops!r}")
    if "rope" in ops:
        probe_rope(impl, rows)
    if "kv_write" in ops:
        probe_kv_write(impl, rows)
    if "rope_kv" in ops:
        probe_rope_kv(impl, rows)
    if "logprob" in ops:
        probe_logprob(impl, rows, ab=ab or None, rounds=args.rounds, contract=contract, ts=ts)
    res = {"implementation": impl.name, "source_hash": impl.source_hash, "argv": sys.argv, "rows": rows,
           "seconds": time.time() - t0}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "rowops_knob_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    if ab:
        _print_ab(rows, ab)
    _print_best(rows)
    # rows with a coupled knob set differ from the default by design; every other row must not
    lp = impl.module("logprob")
    coupled_now = {k: getattr(lp, k) for k, kind in LOGPROB_AB.items() if kind == "coupled" and hasattr(lp, k)}
    if contract:
        coupled_now[ab] = False   # the contract constant moved (True): bits differ by design
    bad = unexpected_mismatches(rows, coupled_now)
    print(f"{len(rows)} rows, {len(bad)} with bits differing from the default, {res['seconds']:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

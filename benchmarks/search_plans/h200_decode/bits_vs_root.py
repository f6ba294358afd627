"""Interpreter check of a decode candidate tree against the root (kernels/tik_v2), bit for bit (CPU).

Every path, at odd shapes: paged decode (page size 1 and 16) and decode from a dense cache for batches of
mixed lengths around the coupled boundaries (ctx 1, 37, 63, 64, 65, 255, 256, 300, 511, 512, 513, 1100) and
for one request at a time; chunked extend over the same pools; packed varlen prefill (with the LSE). The
candidate runs with its own knob values, then with each launcher override the tree has: ``dec_tiles`` (the
tiles-per-iteration edits) or ``dec_par`` (tile-parallel groups within a split, every grid) forced to 1, 2
and 4; the tile-parallel decode (``tp_max_programs``) or the hand-prefetched loop (``prefetch_max_programs``)
forced on and off. The host rule of a step (if any) picks its path from the grid, so ``--rule-programs N``
sets ``DECODE_TILES4_MAX_PROGRAMS`` / ``DECODE_PAR_MAX_PROGRAMS`` / ``DECODE_TP_MAX_PROGRAMS`` /
``DECODE_PREFETCH_MAX_PROGRAMS`` to N first (0: the rule never takes it). Candidate decode == candidate
prefill (the last row of each sequence) always.

Usage: ``TRITON_INTERPRET=1 python benchmarks/search_plans/h200_decode/bits_vs_root.py CANDIDATE_DIR
[--rule-programs N] [--root DIR]`` (root default kernels/tik_v2); exit 1 on any difference.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..", "kernels", "tik_v2")
LENS_BATCH = [[1, 37, 511, 512, 513], [1100, 64, 255], [63, 65, 256, 300]]
LENS_SINGLE = [1, 37, 511, 512, 513, 1100]


def load(path, pkg):
    mod = types.ModuleType(pkg)
    mod.__path__ = [os.path.abspath(path)]
    sys.modules[pkg] = mod
    return importlib.import_module(f"{pkg}.attention")


def _bits(x):
    import torch

    return x.view(torch.int16) if x.dtype in (torch.bfloat16, torch.float16) else x.view(torch.int32)


def pool(ks, vs, page, seed):
    """K/V of each request scattered into a shuffled paged pool (slot / page 0 reserved, as in SGLang)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    Hkv, D = ks[0].shape[1], ks[0].shape[2]
    n_pages = sum(-(-k.shape[0] // page) for k in ks)
    ids = (torch.randperm(n_pages, generator=g) + 1).tolist()
    kp = torch.zeros((n_pages + 1) * page, Hkv, D, dtype=ks[0].dtype)
    vp = torch.zeros_like(kp)
    width = max(-(-k.shape[0] // page) for k in ks)
    table = torch.zeros(len(ks), width, dtype=torch.int32)
    it = iter(ids)
    for r, (k, v) in enumerate(zip(ks, vs)):
        L = k.shape[0]
        pages = [next(it) for _ in range(-(-L // page))]
        table[r, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        slots = (torch.tensor(pages)[:, None] * page + torch.arange(page)[None, :]).reshape(-1)[:L]
        kp[slots], vp[slots] = k, v
    return kp, vp, table


def main(argv):
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from areal_tik_plugin.runtime.interp import ensure_interpreter_if_no_gpu

    ensure_interpreter_if_no_gpu()
    import torch

    root_dir = argv[argv.index("--root") + 1] if "--root" in argv else ROOT
    root, cand = load(root_dir, "_dbits_root"), load(argv[0], "_dbits_cand")
    if "--rule-programs" in argv:
        n = int(argv[argv.index("--rule-programs") + 1])
        rule = next((r for r in ("DECODE_TILES4_MAX_PROGRAMS", "DECODE_PAR_MAX_PROGRAMS", "DECODE_TP_MAX_PROGRAMS", "DECODE_PREFETCH_MAX_PROGRAMS") if hasattr(cand, r)), None)
        if rule is None:
            raise SystemExit("--rule-programs: the candidate has no DECODE_TILES4_MAX_PROGRAMS / DECODE_TP_MAX_PROGRAMS")
        setattr(cand, rule, n)
        print(f"candidate {rule} = {n}")
    knobs = cand._cfg()
    variants = [("own knobs", {})]
    if "dec_tiles" in knobs:
        variants += [(f"dec_tiles={t}", {"dec_tiles": t}) for t in (1, 2, 4)]
    if "dec_par" in knobs:  # the tile-parallel groups of a split on every grid
        variants += [(f"dec_par={t}", {"dec_par": t, "dec_par_max_programs": 1 << 30}) for t in (1, 2, 4)]
    if "prefetch_max_programs" in knobs:  # the hand-prefetched full-tile loop on every grid, and nowhere
        variants += [("prefetch", {"prefetch_max_programs": 1 << 30}), ("pipelined", {"prefetch_max_programs": 0})]
    if "tp_max_programs" in knobs:  # the tile-parallel decode on every grid and request length, and nowhere
        variants += [("tile-parallel", {"tp_max_programs": 1 << 30, "tp_min_tiles": 1}),
                     ("split kernel", {"tp_max_programs": 0})]
    print(f"candidate knobs: DECODE_TILES_PER_ITER={getattr(cand, 'DECODE_TILES_PER_ITER', '-')}, "
          f"DECODE_STAGES={cand.DECODE_STAGES}, DECODE_WARPS={cand.DECODE_WARPS}")
    torch.manual_seed(0)
    Hq, Hkv, D = 4, 2, 64
    sc = 1.0 / D ** 0.5
    bad = checks = 0

    def same(name, a, b):
        nonlocal bad, checks
        ok = torch.equal(_bits(a), _bits(b))
        checks += 1
        bad += not ok
        if not ok:
            print(f"DIFFERENT: {name}")
        return ok

    batches = LENS_BATCH + [[n] for n in LENS_SINGLE]
    for bi, lens in enumerate(batches):
        ks = [torch.randn(n, Hkv, D).to(torch.bfloat16) for n in lens]
        vs = [torch.randn(n, Hkv, D).to(torch.bfloat16) for n in lens]
        qs = [torch.randn(n, Hq, D).to(torch.bfloat16) for n in lens]
        B = len(lens)
        sl = torch.tensor(lens, dtype=torch.int32)
        rows = torch.arange(B, dtype=torch.int32)
        qd = torch.stack([q[-1] for q in qs]).contiguous()
        cu = torch.tensor([sum(lens[:i]) for i in range(B + 1)], dtype=torch.int32)
        # prefill (packed) root vs candidate, with and without the LSE; its last rows are what decode must give
        pk, pv, pq = torch.cat(ks), torch.cat(vs), torch.cat(qs)
        for lse in (False, True):
            a = root.prefill(pq, pk, pv, cu, max(lens), sc, return_lse=lse)
            b = cand.prefill(pq, pk, pv, cu, max(lens), sc, return_lse=lse)
            for x, y in zip(a if lse else (a,), b if lse else (b,)):
                same(f"prefill lens={lens} lse={lse}", x, y)
        full = cand.prefill(pq, pk, pv, cu, max(lens), sc)
        last = full[(cu[1:] - 1).long()]
        for page in (1, 16):
            kp, vp, table = pool(ks, vs, page, seed=bi)
            cap = table.shape[1] * page
            ref = root.decode(qd, kp, vp, sl, table, rows, sc, page, cap)
            for label, over in variants:
                out = cand.decode(qd, kp, vp, sl, table, rows, sc, page, cap, **over)
                same(f"decode page={page} lens={lens} {label} vs root", ref, out)
            same(f"decode page={page} lens={lens} == prefill last rows", ref, last)
            # chunked extend of each request's last min(L, 40) rows over the same pool, root vs candidate
            ch = [min(n, 40) for n in lens]
            cq = torch.cat([q[-c:] for q, c in zip(qs, ch)]).contiguous()
            cuq = torch.tensor([sum(ch[:i]) for i in range(B + 1)], dtype=torch.int32)
            pre = torch.tensor([n - c for n, c in zip(lens, ch)], dtype=torch.int32)
            ea = root.extend(cq, kp, vp, cuq, pre, table, rows, max(ch), sc, page)
            eb = cand.extend(cq, kp, vp, cuq, pre, table, rows, max(ch), sc, page)
            same(f"extend page={page} lens={lens} vs root", ea, eb)
        # dense cache [B, S, Hkv, D]
        S = max(lens)
        kc = torch.zeros(B, S, Hkv, D, dtype=torch.bfloat16)
        vc = torch.zeros_like(kc)
        for r, (k, v) in enumerate(zip(ks, vs)):
            kc[r, :k.shape[0]], vc[r, :v.shape[0]] = k, v
        ref = root.decode(qd, kc, vc, sl, None, None, sc, 1, S)
        for label, over in variants:
            same(f"decode dense lens={lens} {label} vs root", ref, cand.decode(qd, kc, vc, sl, None, None, sc, 1, S, **over))
        print(f"lens={lens}: {'same bits' if not bad else f'{bad} difference(s) so far'}", flush=True)
    print(f"{checks} checks, {bad} different")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

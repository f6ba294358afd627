"""GPU contract checks and benchmarks for the KV-cache write (SGLang set_kv_buffer semantics) at the
KV head shapes of Qwen2.5-1.5B (2x128), Qwen3-4B (8x128) and Qwen3-30B-A3B (4x128).

Checks (bitwise): the pool equals torch's ``k_cache[loc] = k`` for 1..16384 tokens at random slots
(other slots untouched); a prefill chunk written at once == the same tokens written one decode step
at a time; strided K/V views of the QKV output; fp32 and fp8 pools; free launch knobs; CUDA-graph
replay with changing slots == eager. Benchmarks: vs torch index assignment, TB/s.
"""

from __future__ import annotations

import torch

from areal_tik_plugin.contract import baselines as B

from areal_tik_plugin.contract._rowops import (BENCH_T, DEV, MODELS, QUICK_BENCH_T, add_shares, copy_of, graph_vs_eager,
                                          rand, ratio, streamed, tbps, timed)
from areal_tik_plugin.ops import kv_write

# pool slots (slot 0 is SGLang's padding slot, never written): room for the largest bench T (65536) at
# distinct random slots; 65536 slots left the T=65536 rows one slot short (evidence, not measured)
SLOTS = 1 << 18
COPY_T = (1, 7, 257, 4096, 16384)
N_KNOB = 1024


def _pool(hkv, d, dtype=torch.bfloat16, seed=0):
    return rand(SLOTS, hkv, d, dtype=torch.float32, seed=seed).to(dtype), \
        rand(SLOTS, hkv, d, dtype=torch.float32, seed=seed + 1).to(dtype)


def _loc(T, seed=0):
    if T > SLOTS - 1:
        raise ValueError(f"kv_write bench: T={T} tokens need T distinct pool slots, the pool has {SLOTS - 1}")
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randperm(SLOTS - 1, generator=g)[:T] + 1).to(DEV)


def _check_copy(rec, tag, hkv, d, dtype):
    for T in COPY_T:
        kc, vc = _pool(hkv, d, dtype, seed=T)
        rk, rv = kc.clone(), vc.clone()
        k, v = rand(T, hkv, d, dtype=dtype, seed=T + 2), rand(T, hkv, d, dtype=dtype, seed=T + 3)
        loc = _loc(T, seed=T)
        kv_write(kc, vc, loc, k, v)
        rk[loc], rv[loc] = k, v
        rec.bitwise(f"pool_k_eq_index_put[{tag}/T{T}]", kc, rk)
        rec.bitwise(f"pool_v_eq_index_put[{tag}/T{T}]", vc, rv)


def _check_chunk_vs_decode(rec, tag, hkv, d, hq):
    T = 257
    qkv = rand(T, (hq + 2 * hkv) * d, seed=4)
    k = qkv[:, hq * d:(hq + hkv) * d].view(T, hkv, d)
    v = qkv[:, (hq + hkv) * d:].view(T, hkv, d)
    loc = _loc(T, seed=5).to(torch.int32)
    kc, vc = _pool(hkv, d, seed=6)
    kc2, vc2 = kc.clone(), vc.clone()
    kv_write(kc, vc, loc, k, v)
    for t in range(T):
        kv_write(kc2, vc2, loc[t:t + 1], k[t:t + 1], v[t:t + 1])
    rec.bitwise(f"chunk_eq_decode_steps_k[{tag}]", kc, kc2)
    rec.bitwise(f"chunk_eq_decode_steps_v[{tag}]", vc, vc2)
    rec.bitwise(f"strided_views_copied[{tag}]", kc[loc.long()], k.contiguous())


def _check_dtypes(rec, hkv, d):
    for dtype in (torch.float32, torch.float8_e4m3fn):
        kc = torch.zeros(4096, hkv, d, device=DEV, dtype=dtype)
        vc = torch.zeros_like(kc)
        k = rand(100, hkv, d, dtype=torch.float32, seed=7).to(dtype)
        loc = torch.randperm(4096, device=DEV)[:100]
        kv_write(kc, vc, loc, k, k)
        iv = {1: torch.int8, 4: torch.int32}[kc.element_size()]
        rec.check(f"exact_copy[{str(dtype)[6:]}]", torch.equal(kc[loc].view(iv), k.view(iv)) and
                  torch.equal(vc[loc].view(iv), k.view(iv)))


def _check_free_knobs(rec, hkv, d):
    from areal_tik_plugin.runtime.loader import get_implementation

    m = get_implementation().module("kv_write")
    T = N_KNOB
    k, v = rand(T, hkv, d, seed=8), rand(T, hkv, d, seed=9)
    loc = _loc(T, seed=10)
    kc, vc = _pool(hkv, d, seed=11)
    ref_k, ref_v = kc.clone(), vc.clone()
    m.forward(ref_k, ref_v, loc, k, v)
    saved = (m.TILE_ELEMS, m.WARPS)
    try:
        for te, w in ((128, 1), (512, 2), (4096, 8)):
            m.TILE_ELEMS, m.WARPS = te, w
            a, b = kc.clone(), vc.clone()
            m.forward(a, b, loc, k, v)
            rec.bitwise(f"free_knobs_k[{hkv}/e{te}/w{w}]", a, ref_k)
            rec.bitwise(f"free_knobs_v[{hkv}/e{te}/w{w}]", b, ref_v)
    finally:
        m.TILE_ELEMS, m.WARPS = saved


def _check_graph(rec, hkv, d):
    B = 64
    kc, vc = _pool(hkv, d, seed=12)
    ke, ve = kc.clone(), vc.clone()
    k, v = rand(B, hkv, d, seed=13), rand(B, hkv, d, seed=14)
    loc = _loc(B, seed=15)

    def step():
        kv_write(kc, vc, loc, k, v)
        return kc, vc

    def refresh(i):
        k.copy_(rand(B, hkv, d, seed=600 + i))
        v.copy_(rand(B, hkv, d, seed=700 + i))
        loc.copy_(_loc(B, seed=800 + i))

    def eager():
        kv_write(ke, ve, loc, k, v)
        return ke, ve

    # the warm-up/capture writes of step() hit slots eager never saw: replicate them once
    kv_write(ke, ve, loc, k, v)
    graph_vs_eager(rec, f"graph_kv_write[{hkv}]", step, refresh, eager)


def run_checks(rec, quick: bool = False) -> None:
    torch.manual_seed(0)
    models = list(MODELS.items())[:1] if quick else list(MODELS.items())
    for name, cfg in models:
        hkv, d = cfg["hkv"], cfg["d"]
        for dtype in (torch.bfloat16, torch.float16):
            rec.run(f"copy[{name}/{str(dtype)[6:]}]", _check_copy, rec, f"{name}/{str(dtype)[6:]}", hkv, d, dtype)
        rec.run(f"chunk_vs_decode[{name}]", _check_chunk_vs_decode, rec, name, hkv, d, cfg["hq"])
        rec.run(f"free_knobs[{name}]", _check_free_knobs, rec, hkv, d)
        rec.run(f"graph[{name}]", _check_graph, rec, hkv, d)
    rec.run("dtypes", _check_dtypes, rec, 8, 128)


INDEX_PUT = "torch index_put (SGLang's set_kv_buffer: k_buffer[loc] = k; v_buffer[loc] = v)"


def run_bench(rec, quick: bool = False) -> None:
    """Ours vs what SGLang runs to write the new tokens' K/V into its pool (torch index_put)."""
    torch.manual_seed(0)
    rows = []
    ratios = {k: [] for k in ("vs_torch_index_put", "vs_torch_index_put_graph", "hbm_frac_T4096plus",
                              "hbm_frac_T4096plus_graph")}
    Ts = QUICK_BENCH_T if quick else BENCH_T
    for name, cfg in MODELS.items():
        hkv, d = cfg["hkv"], cfg["d"]
        kc, vc = _pool(hkv, d, seed=16)
        for T in Ts:
            k, v = rand(T, hkv, d, seed=T), rand(T, hkv, d, seed=T + 1)
            loc = _loc(T, seed=T)

            def torch_write():
                kc[loc] = k
                vc[loc] = v

            ours = timed(rec, "kv_write/ours", lambda: kv_write(kc, vc, loc, k, v))
            base = timed(rec, "kv_write/torch", torch_write)
            nbytes = 4 * T * hkv * d * 2 + T * 8
            if T >= 4096:  # other rows, other slots: every copy writes different pool memory
                streamed(rec, "kv_write/ours", ours, nbytes,
                         lambda i: (lambda k=copy_of(k, i), v=copy_of(v, i), loc=loc if i == 0 else _loc(T, seed=T + 1000 * i):
                                    kv_write(kc, vc, loc, k, v)))
            bw = tbps(nbytes, ours)
            row = {"T": T, "kv_heads": hkv, "bytes": nbytes, "ours": ours, "torch_index_put": base, "ours_bw": bw,
                   **{k: v for k, v in B.build_row(ours, {INDEX_PUT: base}).items() if k != "ours"}}
            rows.append(row)
            c, g = ratio(base, ours, "cold_us"), ratio(base, ours, "graph_us")
            row["vs_torch_cold"], row["vs_torch_graph"] = c, g
            ratios["vs_torch_index_put"].append(c)
            ratios["vs_torch_index_put_graph"].append(g)
            if T >= 4096:
                add_shares(ratios, bw, T)
            rec.bench(f"kv_write[{name}/T{T}]", **row)
    B.summarize(rec, rows)
    for k, v in ratios.items():
        rec.summarize(k, v)

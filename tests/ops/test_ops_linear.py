"""ops.linear: bitwise row invariance (any M, any position, any tile config), accuracy vs fp64,
gradients vs fp64 autograd, input validation. CPU: kernels run under TRITON_INTERPRET=1."""

from __future__ import annotations

import os

import pytest
import torch

from areal_tik_plugin import ops
from areal_tik_plugin.runtime.loader import get_implementation

DTYPES = (torch.bfloat16, torch.float16)
# Accuracy vs fp64 (|out - ref| <= atol + rtol * |ref|). The output is rounded once to the
# activation dtype (the CPU interpreter truncates fp32 -> bf16, so allow one bf16 ulp).
TOL = {torch.bfloat16: (1e-3, 2 ** -7), torch.float16: (1e-3, 2 ** -10)}
# Shapes (K, N): K a multiple of GEMM_BLOCK_K (TMA-eligible) and not (masked K tail); N odd.
SHAPES = ((192, 80), (100, 47))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _assert_bits(a, b, msg=""):
    assert a.shape == b.shape and a.dtype == b.dtype, msg
    assert torch.equal(_bits(a), _bits(b)), f"{msg}: max |diff| {(a.float() - b.float()).abs().max().item()}"


def _data(M, K, N, dtype, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    return x, w, b


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K,N", SHAPES)
def test_rows_invariant_to_batch(dtype, K, N):
    x, w, b = _data(129, K, N, dtype, seed=K + N)
    full = ops.linear(x, w, b)
    g = torch.Generator().manual_seed(1)
    for M in (1, 3, 17, 64, 129):
        idx = torch.randperm(129, generator=g)[:M]
        sub = ops.linear(x[idx].contiguous(), w, b)
        _assert_bits(sub, full[idx], f"M={M}")
    for i in (0, 63, 64, 128):
        _assert_bits(ops.linear(x[i:i + 1], w, b), full[i:i + 1], f"row {i} alone")


def test_every_tile_config_same_bits():
    """All GPU configurations (free knobs), incl. the TMA kernel, give the CPU default's bits."""
    gemm = get_implementation().module("gemm")
    for K, N in SHAPES:
        for bias in (False, True):
            x, w, b = _data(70, K, N, torch.bfloat16, seed=3, bias=bias)
            ref = gemm.linear(x, w, b)
            for cfg in gemm.all_configs():
                _assert_bits(gemm.linear(x, w, b, config=cfg), ref, f"{cfg['name']} K={K} bias={bias}")


def test_config_table_is_shape_only_and_complete():
    gemm = get_implementation().module("gemm")
    names = {c["name"] for c in gemm.all_configs()}
    seen = set()
    for M in (1, 8, 16, 17, 32, 33, 64, 65, 128, 256, 1024, 4096, 16384, 65536):
        for N, K in ((128, 2048), (1536, 8960), (2048, 1536), (5120, 2048), (12288, 4096), (151936, 2560)):
            cfg = gemm.config_for(M, N, K, 132)
            assert cfg["name"] in names
            assert cfg == gemm.config_for(M, N, K, 132)
            seen.add(cfg["name"])
            if "fallback" in cfg:  # a second kernel's shape: its Triton configuration runs where that one cannot
                assert cfg["fallback"] in names
                seen.add(cfg["fallback"])
            if M <= 64:
                assert cfg["BLOCK_M"] >= M and cfg["name"].startswith("small")
    # every decode-sized variant is reached by some shape (model-like N x K grid), and at least one large tile
    for M in (1, 8, 16, 17, 32, 33, 64):
        for N in (128, 512, 1536, 2048, 2560, 4096, 5120, 6144, 12288, 19456, 24576, 151936):
            for K in (1536, 2048, 2560, 4096, 8960, 9728, 12288):
                seen.add(gemm.config_for(M, N, K, 132)["name"])
    assert {n for n in names if n.startswith("small")} <= seen and any(n.startswith("large") for n in seen)


def test_leading_dims_and_strided_x():
    x, w, b = _data(2 * 9, 192, 80, torch.bfloat16, seed=5)
    full = ops.linear(x, w, b)
    y3 = ops.linear(x.view(2, 9, 192), w, b)
    assert y3.shape == (2, 9, 80)
    _assert_bits(y3.reshape(18, 80), full, "3-D input")
    wide = torch.zeros(18, 256, dtype=x.dtype)
    wide[:, 32:224] = x
    _assert_bits(ops.linear(wide[:, 32:224], w, b), full, "row-strided x")


def test_zero_rows_give_plus_zero():
    x, w, _ = _data(40, 192, 48, torch.bfloat16, seed=11)
    x[[0, 9]] = 0.0
    x[3] = -0.0
    w = -(w.abs() + 0.01).to(torch.bfloat16)  # every product of a zero row is -0.0
    y = ops.linear(x, w)
    assert bool((_bits(y[[0, 3, 9]]) == 0).all())
    for i in (0, 3, 9):
        _assert_bits(ops.linear(x[i:i + 1], w), y[i:i + 1], f"zero row {i}")


def test_empty_rows():
    _, w, b = _data(1, 64, 16, torch.bfloat16)
    y = ops.linear(torch.empty(0, 64, dtype=torch.bfloat16), w, b)
    assert y.shape == (0, 16)
    y = ops.linear(torch.empty(3, 0, 64, dtype=torch.bfloat16), w)
    assert y.shape == (3, 0, 16)


@pytest.mark.parametrize("dtype", DTYPES)
def test_accuracy_vs_fp64(dtype):
    atol, rtol = TOL[dtype]
    for K, N in SHAPES:
        for bias in (False, True):
            x, w, b = _data(37, K, N, dtype, seed=7, bias=bias)
            y = ops.linear(x, w, b)
            ref = x.double() @ w.double().t() + (b.double() if bias else 0)
            torch.testing.assert_close(y.double(), ref, atol=atol, rtol=rtol)
    # fp32 bias
    x, w, _ = _data(5, 64, 16, dtype, seed=8, bias=False)
    b32 = torch.randn(16)
    ref = x.double() @ w.double().t() + b32.double()
    torch.testing.assert_close(ops.linear(x, w, b32).double(), ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_vs_fp64(dtype):
    x, w, b = _data(2 * 17, 100, 47, dtype, seed=9)
    x = x.view(2, 17, 100).requires_grad_()
    w.requires_grad_()
    b.requires_grad_()
    gy = torch.randn(2, 17, 47).to(dtype)
    y = ops.linear(x, w, b)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), gy)
    xr, wr, br = (t.detach().double().requires_grad_() for t in (x, w, b))
    yr = xr @ wr.t() + br
    rx, rw, rb = torch.autograd.grad(yr, (xr, wr, br), gy.double())
    for name, a, r in (("dx", dx, rx), ("dw", dw, rw), ("db", db, rb)):
        assert a.dtype == dtype and a.shape == r.shape, name
        rel = ((a.double() - r).norm() / r.norm()).item()
        assert rel < 1e-2, f"{name}: rel l2 {rel}"
    # only some inputs require grad
    y = ops.linear(x, w.detach())
    (dx2,) = torch.autograd.grad(y.sum(), (x,))
    assert dx2.shape == x.shape


def test_bad_inputs():
    x, w, b = _data(4, 64, 16, torch.bfloat16)
    with pytest.raises(TypeError):
        ops.linear(x.tolist(), w)
    with pytest.raises(TypeError):
        ops.linear(x, "w")
    with pytest.raises(ValueError, match="dtype"):
        ops.linear(x.float(), w.float())
    with pytest.raises(ValueError, match="same as x"):
        ops.linear(x, w.half())
    with pytest.raises(ValueError, match="K=64"):
        ops.linear(x, w[:, :32])
    with pytest.raises(ValueError, match="2-D"):
        ops.linear(x, w[0])
    with pytest.raises(ValueError, match="bias"):
        ops.linear(x, w, b[:5])
    with pytest.raises(ValueError, match="bias"):
        ops.linear(x, w, b.double())
    with pytest.raises(ValueError, match="contiguous"):
        ops.linear(x.t().contiguous().t(), w)
    with pytest.raises(ValueError, match="contiguous"):
        ops.linear(x, w.t().contiguous().t())


# ------------------------------------------------------------------------------------------------
# split-K by reduction length (contract.py GEMM section): long-K weights
# ------------------------------------------------------------------------------------------------
SPLIT_SHAPES = ((4160, 48), (3100, 33))  # (K, N): 3 and 2 chunks, the second with a masked K tail


def test_split_rule_depends_on_k_only():
    gemm = get_implementation().module("gemm")
    assert [-(-K // gemm.split_chunk(K)) for K, _ in SPLIT_SHAPES] == [3, 2]
    assert all(gemm.split_chunk(K) % 64 == 0 for K, _ in SPLIT_SHAPES)
    assert gemm.split_chunk(192) >= 192              # short K: no split
    assert gemm.split_chunk(2560) >= 2560            # Qwen3-4B qkv / gate_up / lm_head: one chain
    assert gemm.split_chunk(4096) == 2048            # Qwen3-4B o_proj, every Qwen3-8B projection
    assert -(-9728 // gemm.split_chunk(9728)) == 5   # Qwen3-4B down_proj
    with pytest.raises(TypeError):                   # no N argument: N must never decide the split
        gemm.split_chunk(2560, 9728)


@pytest.mark.parametrize("K", (4160, 1000))
def test_fused_weight_equals_separate_parts(K):
    """SGLang's fused qkv / gate_up weight gives, column for column, the bits of HF's separate
    projections (the split rule sees K only), split (K 4160) or not (K 1000), at small and large M."""
    x, _, _ = _data(70, K, 1, torch.bfloat16, seed=K, bias=False)
    ws = [_data(1, K, n, torch.bfloat16, seed=K + n, bias=False)[1] for n in (40, 17, 17)]
    fused = torch.cat(ws)
    for M in (3, 70):                                   # workspace path and register path
        _assert_bits(ops.linear(x[:M], fused), torch.cat([ops.linear(x[:M], w) for w in ws], 1), f"K={K} M={M}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K,N", SPLIT_SHAPES)
def test_split_rows_invariant_to_batch(dtype, K, N):
    """Rows alone (partial + ordered reduce) == rows inside large-M calls (chunk sums in registers)."""
    x, w, b = _data(131, K, N, dtype, seed=K + N)
    full = ops.linear(x, w, b)                          # M = 131: the fused (register) path
    g = torch.Generator().manual_seed(2)
    for M in (1, 5, 64, 65, 100):                       # <= 64: workspace path; > 64: fused
        idx = torch.randperm(131, generator=g)[:M]
        _assert_bits(ops.linear(x[idx].contiguous(), w, b), full[idx], f"M={M}")
    for i in (0, 77, 130):
        _assert_bits(ops.linear(x[i:i + 1], w, b), full[i:i + 1], f"row {i} alone")


def _distinct_programs(configs, overridden):
    """One configuration per program the test can run: keys the test overrides say nothing, and Triton's
    interpreter does not model num_warps / num_stages (on a GPU they stay distinct)."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available()
    drop = {"name", *overridden} | ({"num_warps", "num_stages"} if interpreted else set())
    seen, out = set(), []
    for c in configs:
        key = tuple(sorted((k, repr(v)) for k, v in c.items() if k not in drop))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def test_split_every_config_and_path_same_bits():
    gemm = get_implementation().module("gemm")
    K, N = SPLIT_SHAPES[0]
    configs = _distinct_programs(gemm.all_configs(), ("split", "flat", "reduce_in_last", "fixed_trips"))
    data = {bias: _data(70, K, N, torch.bfloat16, seed=5, bias=bias) for bias in (False, True)}
    refs = {bias: gemm.linear(*d) for bias, d in data.items()}
    # bias alternates over the configurations: every path runs with and without one (the epilogue is shared)
    for i, cfg in enumerate(configs):
        bias = bool(i % 2)
        (x, w, b), ref = data[bias], refs[bias]
        for split, flat, last, fixed in (("partial", False, True, True), ("partial", False, False, True),
                                         ("partial", False, True, False), ("fused", False, True, True),
                                         ("fused", True, True, True)):
            got = gemm.linear(x, w, b, config={**cfg, "split": split, "flat": flat, "reduce_in_last": last,
                                               "fixed_trips": fixed})
            _assert_bits(got, ref, f"{cfg['name']} {split} flat={flat} reduce_in_last={last} fixed_trips={fixed} "
                                   f"bias={bias}")


@pytest.mark.parametrize("K", [4096, 4160, 6000])
def test_split_partial_fixed_trips_same_bits(monkeypatch, K):
    """The small-M chunk programs with a fixed trip count (free knob SPLIT_PARTIAL_FIXED_TRIPS: every chunk runs
    CHUNK_K / BLOCK_K steps, a shorter last chunk on zero-filled tiles) == the runtime trip count, on equal
    chunks (K 4096: 2 x 2048), a short last chunk (K 4160) and a last chunk not a multiple of BLOCK_K (K 6000),
    including rows whose products are all -0.0 (the zero tail may flip only an exactly-zero partial's sign,
    which the ordered chunk sum makes +0.0)."""
    gemm = get_implementation().module("gemm")
    N = 24
    x, w, b = _data(5, K, N, torch.bfloat16, seed=K, bias=True)
    x[1] = 0.0
    x[2] = -0.0
    w[3] = w[3].abs()                                   # row 2 x col 3: every product is -0.0
    launched = []
    real = gemm.launch
    monkeypatch.setattr(gemm, "launch", lambda fn, grid, *a, **kw: (launched.append(kw.get("FIXED_TRIPS")),
                                                                    real(fn, grid, *a, **kw))[1])
    out = {}
    for fixed in (False, True):
        cfg = {**gemm.config_for(5, N, K, cpu=True), "split": "partial", "fixed_trips": fixed}
        out[fixed] = gemm.linear(x, w, b, config=cfg)
        assert launched[0] is fixed                     # the knob reached the partial kernel
        launched.clear()
    _assert_bits(out[True], out[False], f"K={K}")
    assert gemm.split_chunk(K) < K


def test_split_reduce_in_last_program_resets_its_tickets():
    """The small-M split reduces in the last chunk program of each tile (atomic ticket): the tickets
    are back at 0 after a call, so repeated calls keep giving the separate-reduce kernel's bits."""
    gemm = get_implementation().module("gemm")
    K, N = SPLIT_SHAPES[0]
    x, w, b = _data(3, K, N, torch.bfloat16, seed=6, bias=True)
    cfg = gemm.config_for(3, N, K, cpu=True)
    assert cfg["split"] == "partial"
    two = gemm.linear(x, w, b, config={**cfg, "reduce_in_last": False})
    cnt = torch.zeros(64, dtype=torch.int32)
    orig = gemm._tile_counters
    gemm._tile_counters = lambda device, n: cnt
    try:
        for _ in range(3):
            _assert_bits(gemm.linear(x, w, b, config={**cfg, "reduce_in_last": True}), two, "reduce in last")
            assert not cnt.any()
    finally:
        gemm._tile_counters = orig


def test_split_differs_from_one_chain_and_is_accurate(monkeypatch):
    """The split is in effect (some bits differ from one unsplit chain) and stays accurate vs fp64."""
    gemm = get_implementation().module("gemm")
    K, N = SPLIT_SHAPES[0]
    x, w, b = _data(64, K, N, torch.float16, seed=9)
    y = ops.linear(x, w, b)
    ref = x.double() @ w.double().T + b.double()
    atol, rtol = TOL[torch.float16]
    assert ((y.double() - ref).abs() <= atol + rtol * ref.abs()).all()
    monkeypatch.setattr(gemm, "split_chunk", lambda k: k)  # one chain over all of K
    one = ops.linear(x, w, b)
    assert ((one.double() - ref).abs() <= atol + rtol * ref.abs()).all()
    assert not torch.equal(_bits(y), _bits(one))


@pytest.mark.parametrize("K,N", SHAPES + SPLIT_SHAPES[:1])
def test_persistent_kernel_same_bits(K, N, monkeypatch):
    """The persistent TMA kernel (a free knob: programs stride over the tiles) gives the default's bits,
    also when each program runs several tiles (3 'SMs' here) and on a split weight (flat form)."""
    gemm = get_implementation().module("gemm")
    monkeypatch.setitem(gemm._NUM_SMS, 0, 3)
    monkeypatch.setattr(gemm, "_num_sms", lambda device: 3)
    grids = []
    kernel = gemm._linear_tma_persistent_kernel

    class Spy:
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(gemm, "_linear_tma_persistent_kernel", Spy())
    for bias in (False, True):
        x, w, b = _data(77, K, N, torch.bfloat16, seed=7, bias=bias)
        ref = gemm.linear(x, w, b)
        for bm, bn in ((64, 32), (16, 16)):
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=3, GROUP_M=2, tma=True, split="fused",
                       flat=True, persistent=True, name=f"persistent_m{bm}_n{bn}")
            _assert_bits(gemm.linear(x, w, b, config=cfg), ref, f"{cfg['name']} K={K} N={N} bias={bias}")
    # TMA needs 16-byte row strides: K=100 / N=47 take the pointer kernel (the same bits, checked above)
    assert grids == ([] if K % 8 or N % 8 else [(3,)] * 4), grids


def test_mid_m_rule(monkeypatch):
    """64 < M where the large-M tile leaves SMs idle (fewer than MID_M_MIN_PROGRAMS_PER_SM programs per SM): the
    decode-sized kernels over several row tiles (an H200 probe over the mid-M shapes)."""
    gemm = get_implementation().module("gemm")
    if hasattr(gemm, "GLUON"):  # the Triton rule itself (a second kernel's band is tested with that kernel)
        monkeypatch.setattr(gemm, "GLUON", False)
    gemm._config_for.cache_clear()
    try:
        # Qwen3-4B o (split, 2 chunks) at M=256: 40 large tiles -> chunk partials 128 x 128 (2 x 20 x 2 = 80 programs)
        cfg = gemm.config_for(256, 2560, 4096, 132)
        assert (cfg["split"], cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"]) == ("partial", 128, 128, 8)
        # Qwen3-30B-A3B o at M=256: 128 x 128 would give 64 programs -> 128 x 64 on 4 warps (128)
        cfg = gemm.config_for(256, 2048, 4096, 132)
        assert (cfg["split"], cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"]) == ("partial", 128, 64, 4)
        # ... and at M=128 (32 / 64 programs at 128 rows) -> the last resort, 64 x 64 (128 programs)
        cfg = gemm.config_for(128, 2048, 4096, 132)
        assert (cfg["split"], cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"]) == ("partial", 64, 64, 4)
        # the router (N 128, unsplit) up to M=4096: 64-row tiles; at 16384 the large tile has 128 tiles
        assert gemm.config_for(1024, 128, 2048, 132)["name"] == "small_m64_n32_w4_fused_flat"
        assert gemm.config_for(4096, 128, 2048, 132)["name"].startswith("small_m64_n64_w4_tma")
        assert gemm.config_for(16384, 128, 2048, 132)["name"].startswith("large")
        # unsplit, enough large tiles (Qwen3-4B gate_up at M=128: 152) -> the large tile stays
        assert gemm.config_for(128, 19456, 2560, 132)["name"].startswith("large")
        # Qwen3-4B qkv at M=128: 48 large tiles -> 64 x 128 on the TMA kernel (2 x 48 = 96 programs)
        cfg = gemm.config_for(128, 6144, 2560, 132)
        assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["tma"], cfg["split"]) == (64, 128, True, "fused")
        monkeypatch.setattr(gemm, "MID_M", False)
        gemm._config_for.cache_clear()
        assert gemm.config_for(256, 2560, 4096, 132)["name"].startswith("large")
        assert gemm.config_for(1024, 128, 2048, 132)["name"].startswith("large")
    finally:
        gemm._config_for.cache_clear()

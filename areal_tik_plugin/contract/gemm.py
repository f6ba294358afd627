"""GPU contract checks and benchmarks for the batch-invariant linear (H200 sizes).

Checks: a row computed alone (M=1) == the same row inside M in {8, 64, ..., 65536} at several
positions; every tile configuration of the per-M table gives the same bits (TMA and pointer
kernels); CUDA-graph replay == eager; accuracy vs an fp32 matmul (and not worse than cuBLAS);
gradients. Benchmarks: vs cuBLAS (torch.nn.functional.linear) at M in {1, 8, 64, 256, 1024, 4096,
16384} on the QKV/O/gate_up/down/lm_head shapes of Qwen2.5-1.5B, Qwen3-4B and the Qwen3-30B-A3B
attention/router shapes; TFLOP/s and TB/s for both.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F

from areal_tik_plugin import bench
from areal_tik_plugin.contract import baselines as B
from areal_tik_plugin.runtime import loader
from areal_tik_plugin.contract._rowops import check_native, check_native_autograd, graph_vs_eager, knobs, stream_copies
from areal_tik_plugin.contract.suite import timed as _time
from areal_tik_plugin.models import weight_shapes
from areal_tik_plugin.ops import linear

DEV = "cuda"

# (model, layer) -> (N, K, has_bias), from the one shape table (areal_tik_plugin.models): every dense weight
# of Qwen2.5-1.5B and Qwen3-4B, and Qwen3-30B-A3B's attention + router
SHAPES = {(m, layer): shape for m in ("qwen2.5-1.5b", "qwen3-4b", "qwen3-30b-a3b")
          for layer, shape in weight_shapes(m).items() if not (m == "qwen3-30b-a3b" and layer == "lm_head")}
# 128: a decode batch of 128 sequences, inside the band 65..255 where kernels may change between 64 and 256
BENCH_M = (1, 8, 64, 128, 256, 1024, 4096, 16384)
# probes also time Qwen3-8B's o_proj: every 8B weight has K >= 4096, so it is split
PROBE_EXTRA_SHAPES = {("qwen3-8b", "o"): weight_shapes("qwen3-8b")["o"]}


def named_shapes() -> dict:
    """``"model:layer" -> (N, K)`` of SHAPES and PROBE_EXTRA_SHAPES: the one weight table of the probe scripts."""
    return {f"{m}:{l}": (n, k) for (m, l), (n, k, _) in {**SHAPES, **PROBE_EXTRA_SHAPES}.items()}

CHECK_M = (8, 24, 64, 256, 1024, 4096, 16384, 65536)  # 24: the BLOCK_M=32 small-M row tile
# M between 64 and 256 (the edges of a band of two 64-row tiles, and 96 inside it), on the split weights whose
# kernel an implementation may choose per M band there (Qwen3-4B o / down: K >= 4096, N 2560)
CHECK_M_MID = (65, 96, 128, 129)
# accuracy vs fp32 math: the output is rounded once to bf16/fp16
TOL = {torch.bfloat16: (1e-2, 1e-2), torch.float16: (2e-3, 2e-3)}


def _gemm():
    from areal_tik_plugin.runtime.loader import get_implementation

    return get_implementation().module("gemm")


def _data(M, N, K, dtype=torch.bfloat16, bias=False, seed=0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(M, K, device=DEV, dtype=dtype, generator=g)
    w = (torch.randn(N, K, device=DEV, generator=g) / K ** 0.5).to(dtype)
    b = torch.randn(N, device=DEV, generator=g).to(dtype) if bias else None
    return x, w, b


# ------------------------------------------------------------------------------------------------
# contract checks
# ------------------------------------------------------------------------------------------------
def _check_rows_vs_m1(rec, tag, N, K, has_bias, Ms, dtype=torch.bfloat16):
    """Rows at fixed positions: alone (M=1) == inside a call of M rows, for every M in Ms."""
    Mmax = max(Ms)
    x, w, b = _data(Mmax, N, K, dtype, has_bias, seed=N + K)
    probe = {0, 1, 7, 8, 63, 64, 255, 1023, 4095, 16383, Mmax - 1, 12345 % Mmax, 777 % Mmax}
    probe = sorted(i for i in probe if i < Mmax)
    single = {i: linear(x[i:i + 1], w, b) for i in probe}
    gemm = _gemm()
    for M in Ms:
        rows = [i for i in probe if i < M]
        y = linear(x[:M], w, b)
        cfg = gemm.config_for(M, N, K, torch.cuda.get_device_properties(0).multi_processor_count)
        rec.bitwise(f"rows_vs_m1[{tag}/M={M}]", y[rows], torch.cat([single[i] for i in rows]),
                    config=cfg["name"], rows=len(rows))
        del y
    # position in the batch: the same rows at other positions (reversed order) of a 257-row call (the data
    # has Mmax rows: a smaller grid, e.g. lm_head's, reverses all of them)
    M = min(257, Mmax)
    idx = torch.arange(M - 1, -1, -1, device=DEV)
    y_fwd = linear(x[:M], w, b)
    y_rev = linear(x[:M][idx].contiguous(), w, b)
    rec.bitwise(f"row_position[{tag}]", y_rev[idx.argsort()], y_fwd)
    # a row-strided view (x rows inside a wider buffer, e.g. a slice of a fused projection)
    wide = torch.zeros(64, K + 64, device=DEV, dtype=dtype)
    wide[:, 32:32 + K] = x[:64]
    rec.bitwise(f"strided_x[{tag}]", linear(wide[:, 32:32 + K], w, b), linear(x[:64], w, b))


def _check_fused_vs_separate(rec, tag, parts, K, Ms=(1, 8, 64, 65, 1024, 4096)):
    """A fused projection (SGLang's qkv_proj / gate_up_proj) == its parts run separately (HF's q/k/v,
    gate/up), column for column: the split rule and every row's chain depend on K only."""
    x, _, _ = _data(max(Ms), 1, K, seed=K)
    ws = [_data(1, n, K, seed=K + n + i)[1] for i, n in enumerate(parts)]
    fused = torch.cat(ws)
    for M in Ms:
        rec.bitwise(f"fused_vs_separate[{tag}/M={M}]", linear(x[:M], fused),
                    torch.cat([linear(x[:M], w) for w in ws], dim=1), split=_gemm().split_chunk(K) < K)


def _check_zero_rows(rec):
    """All-zero input rows against all-negative weights (every product -0.0): +0.0 on every path."""
    N, K = 5120, 2048
    x = torch.randn(1024, K, device=DEV).to(torch.bfloat16)
    x[[0, 5, 1023]] = 0.0
    x[7] = -0.0
    w = -(torch.rand(N, K, device=DEV) + 0.01).to(torch.bfloat16)
    full = linear(x, w)
    for i in (0, 5, 7, 1023):
        rec.bitwise(f"zero_row_vs_m1[{i}]", full[i:i + 1], linear(x[i:i + 1], w))
    rec.check("zero_rows_are_plus_zero", bool((full[[0, 5, 7, 1023]].view(torch.int16) == 0).all()))


def _check_all_configs(rec, tag, N, K, has_bias, M=300):
    """Every free-knob configuration (incl. TMA on/off) gives the default configuration's bits."""
    gemm = _gemm()
    x, w, b = _data(M, N, K, torch.bfloat16, has_bias, seed=1)
    ref = gemm.linear(x, w, b)
    split = gemm.split_chunk(K) < K
    for cfg in gemm.all_configs():
        rec.bitwise(f"config[{tag}/{cfg['name']}]", gemm.linear(x, w, b, config=cfg), ref)
        if cfg["tma"]:
            rec.bitwise(f"config[{tag}/{cfg['name']}/no_tma]", gemm.linear(x, w, b, config=dict(cfg, tma=False)), ref)
        if split:  # a split weight: the other path (workspace + ordered reduce vs registers) too
            other = "fused" if cfg.get("split") == "partial" else "partial"
            rec.bitwise(f"config[{tag}/{cfg['name']}/{other}]", gemm.linear(x, w, b, config=dict(cfg, split=other)), ref)
            for last in (False, True):  # the ordered reduce in a second kernel / in each tile's last program
                rec.bitwise(f"config[{tag}/{cfg['name']}/partial/reduce_in_last={last}]",
                            gemm.linear(x, w, b, config=dict(cfg, split="partial", reduce_in_last=last)), ref)
            # the chunk programs' K loop with the other trip-count form (fixed + zero-filled tail / runtime)
            ft = not getattr(gemm, "SPLIT_PARTIAL_FIXED_TRIPS", False)
            rec.bitwise(f"config[{tag}/{cfg['name']}/partial/fixed_trips={ft}]",
                        gemm.linear(x, w, b, config=dict(cfg, split="partial", fixed_trips=ft)), ref)
            flat = not cfg.get("flat", False)  # the fused path's other loop form (one flat loop / one per chunk)
            rec.bitwise(f"config[{tag}/{cfg['name']}/fused_flat={flat}]",
                        gemm.linear(x, w, b, config=dict(cfg, split="fused", flat=flat)), ref)
    # one row alone through each small-M config == the default big-M result
    for cfg in gemm.all_configs():
        if cfg["name"].startswith("small"):
            rec.bitwise(f"config_row[{tag}/{cfg['name']}]", gemm.linear(x[5:6], w, b, config=cfg), ref[5:6])
    if split:  # repeated small-M calls reuse the tile tickets (reset by the reducing program)
        for i in range(3):
            rec.bitwise(f"config_row[{tag}/repeat{i}]", gemm.linear(x[7:9], w, b), ref[7:9])


def _check_config_coverage(rec):
    """Every configuration of the table is the choice for some (M, N, K) of the checks/benchmarks."""
    gemm = _gemm()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chosen = {gemm.config_for(M, N, K, sms)["name"] for (N, K, _) in SHAPES.values()
              for M in (1, 8, 17, 33, 64) + BENCH_M + CHECK_M + CHECK_M_MID}
    names = [c["name"] for c in gemm.all_configs()]
    rec.check("config_table_coverage", True, chosen=sorted(chosen), never_chosen=sorted(set(names) - chosen))


def _check_graph(rec):
    for (N, K), M in [((5120, 2048), m) for m in (1, 8, 64, 1024)] + [((2560, 9728), m) for m in (1, 64, 300)]:
        x, w, _ = _data(M, N, K, seed=M)
        out = torch.empty(M, N, device=DEV, dtype=torch.bfloat16)
        gemm = _gemm()

        def step():
            gemm.linear(x, w, None, out=out)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        for it in range(2):
            x.copy_(torch.randn_like(x))
            g.replay()
            torch.cuda.synchronize()
            rec.bitwise(f"graph_replay_vs_eager[N={N}/K={K}/M={M}/{it}]", out.clone(), linear(x, w))
        # the public op captured too (allocates inside the graph)
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2):
            y_static = linear(x, w)
        x.copy_(torch.randn_like(x))
        g2.replay()
        torch.cuda.synchronize()
        rec.bitwise(f"graph_op_vs_eager[N={N}/K={K}/M={M}]", y_static.clone(), linear(x, w))


def _check_pdl(rec):
    """Programmatic dependent launch (free knob ``_rowops.PDL``, on by default on sm_90): a chain of
    dependent kernels -- GEMM (split partials with the reduce in the last program, or the persistent
    large-M kernel), RMSNorm, SwiGLU, GEMM -- gives the bits of the same chain launched without PDL,
    eagerly and replayed from a CUDA graph on fresh inputs (a consumer that read its input before the
    producer finished would show here)."""
    from areal_tik_plugin.runtime.loader import get_implementation
    from areal_tik_plugin.ops import rms_norm, swiglu_fused

    ro = get_implementation().module("_rowops")
    _, w1, _ = _data(1, 2 * 4864, 2560, seed=11)
    _, w2, _ = _data(1, 2560, 4864, seed=12)
    wn = torch.rand(2560, device=DEV, dtype=torch.bfloat16) + 0.5

    def chain(x):
        return linear(swiglu_fused(linear(rms_norm(x, wn, 1e-6), w1)), w2)

    def no_pdl(x):
        with knobs(ro, PDL=False):
            return chain(x)

    with knobs(ro, PDL=True):
        for M in (1, 64, 1024):
            x = torch.randn(M, 2560, device=DEV, dtype=torch.bfloat16)
            rec.bitwise(f"pdl_eager[M={M}]", chain(x), no_pdl(x))
            graph_vs_eager(rec, f"pdl_graph_vs_no_pdl[M={M}]", lambda: chain(x),
                           lambda i: x.copy_(torch.randn_like(x)), lambda: no_pdl(x))


def _check_fast_launch(rec):
    """The short host launch path (free knob ``_rowops.FAST_LAUNCH``: Triton's binder and cache key, then
    the compiled kernel's launcher) gives the bits of Triton's own launch path: GEMM on the pointer,
    split-partial and TMA kernels, RMSNorm, SwiGLU, RoPE, the token log-prob, eagerly and from a graph."""
    from areal_tik_plugin.runtime.loader import get_implementation
    from areal_tik_plugin.ops import apply_rope, rms_norm, swiglu_fused, token_logprobs

    ro = get_implementation().module("_rowops")
    _, w1, _ = _data(1, 2 * 4864, 2560, seed=21)
    _, w2, _ = _data(1, 2560, 4864, seed=22)
    _, wq, _ = _data(1, 4096, 2560, seed=23)
    _, wv, _ = _data(1, 1000, 2560, seed=24)
    wn = torch.rand(2560, device=DEV, dtype=torch.bfloat16) + 0.5
    inv = 1.0 / (1e6 ** (torch.arange(0, 128, 2, device=DEV, dtype=torch.float32) / 128))

    def chain(x, pos, tok):
        h = rms_norm(x, wn, 1e-6)
        q = linear(h, wq).view(-1, 32, 128)
        q, k = apply_rope(q, q[:, :8], pos, inv)
        y = linear(swiglu_fused(linear(h, w1)), w2)
        return q, k, y, token_logprobs(linear(y, wv), tok, 0.7, return_entropy=True)

    def slow(*a):
        with knobs(ro, FAST_LAUNCH=False):
            return chain(*a)

    with knobs(ro, FAST_LAUNCH=True):
        for M in (1, 64, 1024, 1500):
            x = torch.randn(M, 2560, device=DEV, dtype=torch.bfloat16)
            pos = torch.randint(0, 4096, (M,), device=DEV)
            tok = torch.randint(0, 1000, (M,), device=DEV)
            chain(x, pos, tok)  # compile (the first call takes Triton's path)
            fast, ref = chain(x, pos, tok), slow(x, pos, tok)
            for name, a, b in zip(("q", "k", "mlp", "logp", "entropy"), fast[:3] + fast[3], ref[:3] + ref[3]):
                rec.bitwise(f"fast_launch_{name}[M={M}]", a, b)
            graph_vs_eager(rec, f"fast_launch_graph[M={M}]", lambda: chain(x, pos, tok)[2],
                           lambda i: x.copy_(torch.randn_like(x)), lambda: slow(x, pos, tok)[2])


def _check_accuracy(rec, quick, shapes=None, Ms=None):
    shapes = shapes or [SHAPES[("qwen3-4b", "qkv")], SHAPES[("qwen2.5-1.5b", "qkv")], (333, 1000, True)]
    for dtype in (torch.bfloat16, torch.float16):
        for N, K, has_bias in shapes:
            for M in Ms or ((1, 77) if quick else (1, 77, 1024)):
                x, w, b = _data(M, N, K, dtype, has_bias, seed=3)
                y = linear(x, w, b)
                ref = x.float() @ w.float().t() + (b.float() if has_bias else 0)
                atol, rtol = TOL[dtype]
                tag = f"{N}x{K}/M={M}/{str(dtype)[6:]}"
                rec.close(f"accuracy_vs_fp32[{tag}]", y, ref, atol=atol, rtol=rtol)
                cub = F.linear(x, w, b)
                e_ours = float((y.double() - ref.double()).abs().max())
                e_cub = float((cub.double() - ref.double()).abs().max())
                rec.check(f"error_not_worse_than_cublas[{tag}]", e_ours <= 1.5 * e_cub + 1e-6,
                          ours=e_ours, cublas=e_cub)


def _check_backward(rec, N=2048, K=1536, M=333):
    for dtype in (torch.bfloat16, torch.float16):
        x, w, b = _data(M, N, K, dtype, True, seed=4)
        x, w, b = (t.requires_grad_() for t in (x, w, b))
        gy = torch.randn(M, N, device=DEV, dtype=dtype)
        grads = torch.autograd.grad(linear(x, w, b), (x, w, b), gy)
        xr, wr, br = (t.detach().float().requires_grad_() for t in (x, w, b))
        refs = torch.autograd.grad(xr @ wr.t() + br, (xr, wr, br), gy.float())
        for name, a, r in zip(("dx", "dw", "db"), grads, refs):
            rel = float((a.double() - r.double()).norm() / r.double().norm())
            rec.check(f"grad_{name}[{str(dtype)[6:]}]", rel < 1e-2, rel_l2=rel)


def run_checks(rec, quick: bool = False) -> None:
    torch.manual_seed(0)
    rec.run("config_coverage", _check_config_coverage, rec)
    cases = [
        ("qwen3-30b-a3b/qkv", SHAPES[("qwen3-30b-a3b", "qkv")], CHECK_M),
        ("qwen2.5-1.5b/qkv+bias", SHAPES[("qwen2.5-1.5b", "qkv")], CHECK_M),
        ("qwen2.5-1.5b/down", SHAPES[("qwen2.5-1.5b", "down")], CHECK_M[:-1]),
        ("qwen3-4b/gate_up", SHAPES[("qwen3-4b", "gate_up")], CHECK_M[:-2]),
        ("qwen3-4b/lm_head", SHAPES[("qwen3-4b", "lm_head")], CHECK_M[:4]),
        ("qwen3-30b-a3b/router", SHAPES[("qwen3-30b-a3b", "router")], CHECK_M),
        ("qwen3-4b/o(split)", SHAPES[("qwen3-4b", "o")], CHECK_M[:-1]),
        ("qwen3-4b/o(split) mid-M", SHAPES[("qwen3-4b", "o")], CHECK_M_MID),
        ("qwen3-4b/down(split) mid-M", SHAPES[("qwen3-4b", "down")], CHECK_M_MID),
        ("odd/333x1000+bias", (333, 1000, True), (8, 64, 256, 1024, 4096)),
    ]
    if quick:  # one split weight (1.5b down: 5 chunks, K tail-free) stays in the quick grid
        cases = [cases[0], cases[1], cases[2], cases[-1]]
    for tag, (N, K, hb), Ms in cases:
        rec.run(f"rows_vs_m1[{tag}]", _check_rows_vs_m1, rec, tag, N, K, hb, Ms)
    rec.run("rows_vs_m1[fp16]", _check_rows_vs_m1, rec, "fp16/4b-qkv", *SHAPES[("qwen3-4b", "qkv")],
            (8, 64, 1024, 4096), dtype=torch.float16)
    # the three kernel specializations (no bias / bias / bias + K tail) of every configuration
    for tag, (N, K, hb) in (("30b-qkv", SHAPES[("qwen3-30b-a3b", "qkv")]),
                            ("1.5b-qkv+bias", SHAPES[("qwen2.5-1.5b", "qkv")]),
                            ("odd+bias", (333, 1000, True)),
                            ("4b-o(split)", SHAPES[("qwen3-4b", "o")]),
                            ("odd-split+bias", (333, 3100, True))):
        rec.run(f"all_configs[{tag}]", _check_all_configs, rec, tag, N, K, hb)
    # fused vs separate projections (Qwen3-8B: K 4096 is split; Qwen3-4B: K 2560 is not)
    rec.run("fused_vs_separate[8b-qkv]", _check_fused_vs_separate, rec, "8b-qkv", (4096, 1024, 1024), 4096)
    rec.run("fused_vs_separate[8b-gate_up]", _check_fused_vs_separate, rec, "8b-gate_up", (12288, 12288), 4096,
            (1, 64, 1024))
    rec.run("fused_vs_separate[4b-qkv]", _check_fused_vs_separate, rec, "4b-qkv", (4096, 1024, 1024), 2560)
    rec.run("zero_rows", _check_zero_rows, rec)
    rec.run("cuda_graph", _check_graph, rec)
    rec.run("pdl_chain", _check_pdl, rec)
    rec.run("fast_launch", _check_fast_launch, rec)
    rec.run("native", _check_native, rec)
    rec.run("accuracy", _check_accuracy, rec, quick)
    rec.run("backward", _check_backward, rec)


NATIVE_CASES = (("qwen3-4b", "qkv"), ("qwen3-4b", "o"), ("qwen3-4b", "gate_up"), ("qwen3-4b", "down"),
                ("qwen3-4b", "lm_head"), ("qwen2.5-1.5b", "qkv"), ("qwen3-30b-a3b", "router"))
NATIVE_M = (1, 3, 8, 17, 32, 64, 96, 300, 1024)


def _check_native(rec, cases=NATIVE_CASES, Ms=NATIVE_M):
    """The native host path's GEMM recipes: public ``linear`` calls it serves (every configuration: pointer,
    split partials, host-TMA one program per tile and persistent) == the kernel module's ``linear``
    through Triton's launch, eagerly and CUDA-graph captured, and under autograd."""
    impl = loader.current_module("gemm")
    for model, layer in cases:
        N, K, hb = SHAPES[(model, layer)]
        w = (torch.randn(N, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5)
        b = torch.randn(N, device="cuda", dtype=torch.bfloat16) if hb else None
        for M in Ms:
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            tag = f"{model}/{layer}/M{M}"
            check_native(rec, tag, lambda: linear(x, w, b), lambda: impl.linear(x, w, b), served=True)
        x = torch.randn(5, K, device="cuda", dtype=torch.bfloat16)
        check_native_autograd(rec, f"{model}/{layer}/M5", lambda: (x.clone().requires_grad_(), w.clone().requires_grad_()),
                              lambda a, c: linear(a, c, b))


# ------------------------------------------------------------------------------------------------
# benchmarks
# ------------------------------------------------------------------------------------------------


def _rates(M, N, K, has_bias, t):
    if not t:
        return {}
    flops = 2.0 * M * N * K
    nbytes = 2.0 * (M * K + N * K + M * N + (N if has_bias else 0))
    out = {}
    for key in ("cold_us", "graph_us"):
        if t.get(key):
            out[f"tflops_{key[:-3]}"] = flops / (t[key] * 1e-6) / 1e12
            out[f"tbps_{key[:-3]}"] = nbytes / (t[key] * 1e-6) / 1e12
    return out


# Graph timings stream the weights from HBM as a decode step does (every layer's weights are read once
# per step; a 4B model's 8 GB never sit in the 50 MB L2): one replay calls the op once on each of
# enough weight copies to move STREAM_BYTES (METHOD.md: repeated runs over one buffer measure the cache).
# ``graph_l2_us`` keeps the same-weight replay (weights up to ~50 MB partly L2-resident) for reference.
def _weight_copies(N: int, K: int, bias: bool, seed: int):
    g = torch.Generator(device=DEV).manual_seed(seed)
    n = stream_copies(N * K * 2)
    ws = [(torch.randn(N, K, device=DEV, generator=g) / K ** 0.5).to(torch.bfloat16) for _ in range(n)]
    b = torch.randn(N, device=DEV, generator=g).to(torch.bfloat16) if bias else None
    return ws, b


def _time_streamed(rec, name, fn, ws):
    """cold (do_bench, L2 flushed), graph_l2 (same weight replayed) and graph (weights streamed: one call
    per copy in each replay, time per call) of ``fn(w)``."""
    t = _time(rec, name, lambda: fn(ws[0]))
    if not t:
        return None
    t["graph_l2_us"] = t.pop("graph_us")
    try:
        t["graph_us"] = bench.time_graph_each_us([lambda w=w: fn(w) for w in ws])
        t["weight_copies"] = len(ws)
    except Exception as e:
        rec.errors.append(f"{name} streamed: {type(e).__name__}: {e}"[:300])
        t["graph_us"] = None
    return t


def _bench_host_launch(rec) -> None:
    """Host time of one ``ops.linear`` call (Qwen3-4B qkv, M=1: the kernel is shorter than the launch) with
    the short launch path and with Triton's own, against F.linear: what eager prefill / training pay per op."""
    from areal_tik_plugin.runtime.loader import get_implementation

    ro = get_implementation().module("_rowops")
    x, w, _ = _data(1, 6144, 2560, seed=31)

    def host_us(fn):
        return bench.host_us(fn, n=2000, reps=3, warmup=1)

    with knobs(ro, FAST_LAUNCH=True):
        fast = host_us(lambda: linear(x, w))
    with knobs(ro, FAST_LAUNCH=False):
        slow = host_us(lambda: linear(x, w))
    cub = host_us(lambda: F.linear(x, w))
    rec.bench("host_launch_linear_qwen3-4b_qkv_M1", ours_fast_launch_host_us=fast, ours_triton_launch_host_us=slow,
              cublas_host_us=cub, fast_vs_triton_launch=slow / fast, cublas_vs_ours=cub / fast)


CUBLAS = "torch.nn.functional.linear (cuBLAS)"


# set from the command line of python -m areal_tik_plugin.contract (configure())
GEMM_M: tuple = ()  # --gemm-m: cuts the M grid for a shorter run; empty: the full grid
SKIP_KNOBS = False  # --gemm-skip-knobs: no free-knob alternatives (TMA off, other stage counts)


def parse_ms(raw: str) -> tuple:
    try:
        return tuple(int(m) for m in raw.split(",") if m.strip())
    except ValueError:
        raise ValueError(f"--gemm-m: expected a comma list of integers, got {raw!r}") from None


def configure(gemm_m: str = "", skip_knobs: bool = False) -> None:
    global GEMM_M, SKIP_KNOBS
    GEMM_M, SKIP_KNOBS = parse_ms(gemm_m), bool(skip_knobs)


def _env_ms():
    return GEMM_M


def run_bench(rec, quick: bool = False) -> None:
    """Ours vs cuBLAS (``F.linear``, the call every HF / FSDP / SGLang linear makes) at every M of the
    grid on every weight shape; the row names the baseline and its ratio as the strongest."""
    torch.manual_seed(0)
    gemm = _gemm()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ratios = {k: [] for k in ("small_m", "small_m_graph", "small_m_graph_l2", "mid_m", "mid_m_graph",
                              "mid_m_graph_l2", "large_m", "large_m_graph", "large_m_graph_l2")}
    shapes = SHAPES if not quick else {k: v for k, v in SHAPES.items() if k[0] == "qwen3-4b"}
    Ms = _env_ms() or (BENCH_M if not quick else (1, 64, 4096))
    rows = []
    for (model, layer), (N, K, has_bias) in shapes.items():
        ws, b = _weight_copies(N, K, has_bias, seed=N + K)
        w = ws[0]
        for M in Ms:
            x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
            ours = _time_streamed(rec, f"ours {model}/{layer}/M={M}", lambda w_: linear(x, w_, b), ws)
            cub = _time_streamed(rec, f"cublas {model}/{layer}/M={M}", lambda w_: F.linear(x, w_, b), ws)
            row = {"model": model, "layer": layer, "M": M, "N": N, "K": K, "bias": has_bias,
                   "config": gemm.config_for(M, N, K, sms)["name"], "ours": ours, "cublas": cub,
                   "ours_rates": _rates(M, N, K, has_bias, ours), "cublas_rates": _rates(M, N, K, has_bias, cub)}
            row.update({k: v for k, v in B.build_row(ours, {CUBLAS: cub}).items() if k != "ours"})
            rows.append(row)
            if ours and cub:
                row["ratio_cold"] = bench.ratio(cub, ours, "cold_us")
                row["ratio_graph"] = bench.ratio(cub, ours, "graph_us")
                row["ratio_graph_l2"] = bench.ratio(cub, ours, "graph_l2_us")
                bucket = "small_m" if M <= 64 else ("large_m" if M >= 1024 else "mid_m")
                ratios[bucket].append(row["ratio_cold"])
                ratios[bucket + "_graph"].append(row["ratio_graph"])
                ratios[bucket + "_graph_l2"].append(row["ratio_graph_l2"])
            rec.bench(f"linear_{model}_{layer}_M{M}", **row)
            del x
        del ws, w, b
    # free-knob alternatives (informs the per-M table): TMA off, other stage counts
    if not quick and not SKIP_KNOBS:
        for (N, K), M in (((19456, 2560), 64), ((19456, 2560), 4096), ((5120, 2048), 4096), ((12288, 4096), 1),
                          ((12288, 4096), 1024)):
            x, w, _ = _data(M, N, K, seed=5)
            base = gemm.config_for(M, N, K, sms)
            variants = {"default": base}
            if base["tma"]:
                variants["no_tma"] = dict(base, tma=False)
            for st in (3, 5, 7) if base["name"].startswith("large") else (4, 8, 12):
                if st != base["num_stages"]:
                    variants[f"stages{st}"] = dict(base, num_stages=st)
            row = {"M": M, "N": N, "K": K, "config": base["name"]}
            for vname, cfg in variants.items():
                t = _time(rec, f"variant {vname}", lambda: gemm.linear(x, w, None, config=cfg), graph=False)
                row[vname] = t["cold_us"] if t else None
            cub = _time(rec, "cublas variant base", lambda: F.linear(x, w), graph=False)
            row["cublas"] = cub["cold_us"] if cub else None
            rec.bench(f"linear_knobs_M{M}_{N}x{K}", **row)
    # the anchor shape [M,4096]x[4096,12288] of shared/reference/anchors.md
    ws, _ = _weight_copies(12288, 4096, False, seed=6)
    for M in ((1, 64, 1024, 8192) if not quick else (1, 1024)):
        x = torch.randn(M, 4096, device=DEV, dtype=torch.bfloat16)
        ours = _time_streamed(rec, "anchor ours", lambda w_: linear(x, w_), ws)
        cub = _time_streamed(rec, "anchor cublas", lambda w_: F.linear(x, w_), ws)
        rec.bench(f"linear_anchor_4096x12288_M{M}", M=M, ours=ours, cublas=cub,
                  ours_rates=_rates(M, 12288, 4096, False, ours), cublas_rates=_rates(M, 12288, 4096, False, cub),
                  ratio_cold=bench.ratio(cub, ours, "cold_us") if ours and cub else None,
                  ratio_graph=bench.ratio(cub, ours, "graph_us") if ours and cub else None)
    del ws
    _bench_host_launch(rec)
    B.summarize(rec, rows)
    rec.summarize("gemm_vs_cublas_small_m", ratios["small_m"])
    for key in ("small_m", "mid_m", "large_m"):
        for suffix in ("", "_graph", "_graph_l2"):
            rec.summarize(f"gemm_vs_cublas_{key}{suffix}", ratios[key + suffix])

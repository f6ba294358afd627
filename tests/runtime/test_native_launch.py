"""The generic native launcher (areal_tik_plugin.runtime.native.launch, ``glaunch`` in _tik_native.c) on the
CPU: the class it keys variants by refines Triton 3.6's own specialization key (two arguments of one class
always get Triton's same key), keyword values are compared by value and type, a variant's parameters for a
TMA GEMM compiled for sm_90 are the kernel's signature filled with this call's pointers, sizes and
descriptor shapes, calling conventions it cannot serve are refused, and the wrapper the loader installs
takes Triton's path until a variant is learned. (Launching and the TMA encoding need a GPU:
``benchmarks/probes/native_launch_probe`` compares the bits and times the host path on the H200.)"""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

from areal_tik_plugin.runtime import loader, native
from areal_tik_plugin.runtime.native import launch as NL
from tests.helpers.native_build import build_native, launcher_params, needs_triton36

@pytest.fixture(scope="module")
def m(tmp_path_factory):
    mod = build_native(tmp_path_factory)
    from triton.tools.tensor_descriptor import TensorDescriptor

    mod.setup_cpu(torch)
    mod.gsetup((TensorDescriptor, NL._gluon_descriptor_type()))
    yield mod
    mod.invalidate()


def _triton_key(v):
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    return native_specialize_impl(BaseBackend, v, False, True, True)


def _values():
    from triton.tools.tensor_descriptor import TensorDescriptor

    buf = torch.empty(4096, dtype=torch.bfloat16)
    a16 = buf[:1024]          # 16-byte aligned
    a2 = buf[1:1025]          # 2-byte aligned only
    f32 = torch.empty(64, dtype=torch.float32)
    i32 = torch.empty(64, dtype=torch.int32)
    t2 = buf[:32 * 64].view(32, 64)
    out = [a16, a2, buf[8:1032], buf[3:1027], f32, i32, torch.nn.Parameter(torch.empty(8)),
           None, True, False, 0, 1, 2, 15, 16, 17, 32, -16, -1, 2 ** 31 - 16, 2 ** 31, 2 ** 40 + 1, 0.5, 1.0,
           TensorDescriptor(t2, [32, 64], [64, 1], [16, 64]), TensorDescriptor(t2, [32, 64], [64, 1], [32, 64]),
           TensorDescriptor(buf[8:8 + 32 * 64].view(32, 64), [32, 64], [64, 1], [16, 64]),
           TensorDescriptor(buf[:31 * 64].view(31, 64), [31, 64], [64, 1], [16, 64])]
    return out + _gluon_values(buf)


def _gluon_values(buf):
    """Gluon host descriptors (as tik_v6's prefill makes them): their layout is part of Triton's key."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GD

    lay = {b: gl.NVMMASharedLayout.get_default_for([b, 64], gl.bfloat16) for b in (16, 32)}
    other = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    t2 = buf[:32 * 64].view(32, 64)
    return [GD(t2, [32, 64], [64, 1], [16, 64], lay[16]), GD(t2, [32, 64], [64, 1], [32, 64], lay[32]),
            GD(t2, [32, 64], [64, 1], [16, 64], other),
            GD(t2, [32, 64], [64, 1], [16, 64], gl.NVMMASharedLayout.get_default_for([16, 64], gl.bfloat16)),
            GD(buf[8:8 + 32 * 64].view(32, 64), [32, 64], [64, 1], [16, 64], lay[16]),
            GD(buf[:31 * 64].view(31, 64), [31, 64], [64, 1], [16, 64], lay[16])]


@needs_triton36
def test_class_refines_tritons_specialization_key(m):
    """For every pair of argument values: one variant (the class of the first) serves the second only if
    Triton's binder gives both the same key -- so a served call gets the kernel Triton would compile."""
    vals = _values()
    fn = object()
    for i, a in enumerate(vals):
        m.invalidate()
        assert m.glearn(fn, (1,), (a,), {}, ([NL.GP_DROP], [], 0, 4, 0, False, False, None)) is True
        for j, b in enumerate(vals):
            hit = m.gderive(fn, (1,), (b,), {}, False) is not None
            if hit:
                assert _triton_key(a) == _triton_key(b), (i, j, a, b)
            if i == j:
                assert hit
    m.invalidate()


@needs_triton36
def test_keyword_values_compared_by_type_and_value(m):
    fn = object()
    m.invalidate()
    m.glearn(fn, (2, 3), (7,), {"BLOCK": 64, "FLAG": True, "MODE": "x"}, ([NL.GP_I32], [], 0, 4, 0, False, False, None))
    assert m.gderive(fn, (2, 3), (9,), {"BLOCK": 64, "FLAG": True, "MODE": "x"}, False) == [(NL.GP_I32, 9)]
    for kw in ({"BLOCK": 32, "FLAG": True, "MODE": "x"}, {"BLOCK": 64, "FLAG": 1, "MODE": "x"},
               {"BLOCK": 64, "FLAG": True, "MODE": "y"}, {"BLOCK": 64, "FLAG": True},
               {"BLOCK": 64, "FLAG": True, "MODE": "x", "num_warps": 8}):
        assert m.gderive(fn, (2, 3), (9,), kw, False) is None, kw
    assert m.gderive(object(), (2, 3), (9,), {"BLOCK": 64, "FLAG": True, "MODE": "x"}, False) is None
    # an unhashable keyword value, a callable grid, a tuple argument: not taken (Triton's path)
    assert m.gderive(fn, (2, 3), (9,), {"BLOCK": [64]}, False) is None
    assert m.gderive(fn, lambda meta: (1,), (9,), {}, False) is None
    assert m.gderive(fn, (2,), ((1, 2),), {}, False) is None
    m.invalidate()
    assert m.gderive(fn, (2, 3), (9,), {"BLOCK": 64, "FLAG": True, "MODE": "x"}, False) is None


@needs_triton36
def test_refused_class_stays_refused(m):
    fn = object()
    m.invalidate()
    assert m.glearn(fn, (1,), (5,), {}, None, "because") is False
    assert m.gderive(fn, (1,), (5,), {}, False) is None
    assert m.stats()["launch"]["refused_reasons"] == {"because": 1}
    m.invalidate()


def _captured(mod, call):
    from benchmarks.compile_rowops_sm90 import Capture

    R = mod("_rowops")
    grids, orig = [], R._launch
    R._launch = lambda fn, grid, *a, **kw: (grids.append(grid), orig(fn, grid, *a, **kw))[1]
    try:
        with Capture() as cap:
            call()
    finally:
        R._launch = orig
    return [(k, g, a, kw) for (k, a, kw), g in zip(cap.records, grids)]


@needs_triton36
def test_tma_gemm_variant_parameters():
    """Run in a fresh interpreter: compiling for sm_90 needs a Triton without the interpreter state the
    other tests leave behind."""
    _in_fresh_interpreter("_run_tma_gemm_check")


def _in_fresh_interpreter(check: str) -> None:
    """Run this module's ``check()`` in a new Python without TRITON_INTERPRET (an sm_90 compile needs it)."""
    import subprocess

    code = f"import sys, torch, tests.runtime.test_native_launch as t; t.{check}(); print('OK')"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=root, env=env)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def _run_tma_gemm_check():
    import tempfile

    from triton.tools.tensor_descriptor import TensorDescriptor

    os.environ["TIK_CACHE_DIR"] = tempfile.mkdtemp()
    mod = native.load_module(native.build())
    mod.setup_cpu(torch)
    mod.gsetup(TensorDescriptor)
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from benchmarks.compile_rowops_sm90 import load_impl_no_interp

    impl = load_impl_no_interp(os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "tik_v2"))
    R = impl("_rowops")
    R._PDL_DEVICES[-1] = True
    R.FAST_LAUNCH = False
    _tma_gemm_variant_parameters(mod, impl)
    _tma_gemm_recipes(mod, impl)


def _tma_gemm_variant_parameters(m, sm90_tik_v2):
    """The GEMM's TMA configuration compiled for sm_90: every parameter of the variant, in signature order,
    is what Triton's launcher passes (descriptor: the map, then its shape as i32 and strides as i64); a
    second call of the same class gets its own pointers and sizes, a misaligned operand is another class."""
    from benchmarks.compile_attention_sm90 import compile_launch

    M, N, K = 256, 2048, 1536
    G = sm90_tik_v2("gemm")
    x = torch.randn(M, K).to(torch.bfloat16)
    w = torch.randn(N, K).to(torch.bfloat16)
    (fn, grid, args, kw), = _captured(sm90_tik_v2, lambda: G.linear(x, w))
    assert fn.fn.__name__ == "_linear_tma_kernel"
    ck = compile_launch(fn, args, dict(kw))
    kern = types.SimpleNamespace(src=ck.src, metadata=ck.metadata, function=0x1234)
    ap, vals, ckw = NL.layout(fn, args, kw)
    assert vals == tuple(args) and ckw == kw  # every runtime parameter passed positionally
    plan, why = NL.plan(ap, vals, ckw, kern)
    assert plan, why
    assert plan[0][:3] == [NL.GP_DESC] * 3 and plan[1][0][4] == tuple(ck.metadata.tensordesc_meta[0]["block_size"])
    m.invalidate()
    assert m.glearn(fn, grid, args, kw, plan) is True
    def want(a):
        return launcher_params(a)

    assert m.gderive(fn, grid, args, kw, False) == want(args)
    # same class, other operands (another M and N of the same class where M is a multiple of 16)
    M2, N2 = M + 16, N + 16
    x2 = torch.randn(M2, K).to(torch.bfloat16)
    w2 = torch.randn(N2, K).to(torch.bfloat16)
    (fn2, grid2, args2, kw2), = _captured(sm90_tik_v2, lambda: G.linear(x2, w2))
    if kw2 == kw:
        assert m.gderive(fn2, grid2, args2, kw2, False) == want(args2)
    # M one larger (not divisible by 16) or another block shape: other classes, Triton's path
    from triton.tools.tensor_descriptor import TensorDescriptor

    assert m.gderive(fn, grid, args[:4] + (M + 1,) + args[5:], kw, False) is None
    d = args[0]
    other = TensorDescriptor(d.base, d.shape, d.strides, [d.block_shape[0] // 2, d.block_shape[1]])
    assert m.gderive(fn, grid, (other,) + args[1:], kw, False) is None
    m.invalidate()


@needs_triton36
def test_gluon_prefill_variant_parameters():
    """tik_v6's warp-specialized Gluon prefill compiled for sm_90 (fresh interpreter, as above): the native
    launcher takes its calling convention (no scratch memory, three TMA descriptors, 12 warps) and derives
    every parameter of a call in signature order; another layout or block is another class."""
    _in_fresh_interpreter("_run_gluon_prefill_check")


def _run_gluon_prefill_check():
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    os.environ["TIK_CACHE_DIR"] = tempfile.mkdtemp()
    m = native.load_module(native.build())
    m.setup_cpu(torch)
    from triton.tools.tensor_descriptor import TensorDescriptor

    m.gsetup((TensorDescriptor, NL._gluon_descriptor_type()))
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
    from benchmarks.compile_gluon_sm90 import _load

    g = _load(os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "tik_v6"))
    T, Hq, Hkv, D, tile = 1000, 8, 2, 128, 64
    q = torch.randn(T, Hq, D).to(torch.bfloat16)
    k, v = (torch.randn(T, Hkv, D).to(torch.bfloat16) for _ in range(2))
    o, lse = torch.empty_like(q), torch.empty(Hq, T)
    cu = torch.tensor([0, 400, T], dtype=torch.int32)
    sched = torch.zeros(1, dtype=torch.int32)
    s = g.ws_schedule(2, Hq, Hkv, 600, D, 2, 132, 50 * 2 ** 20, 2)
    args = (g._descriptor(q, Hq, D, (64, D)), g._descriptor(k, Hkv, D, (tile, D)), g._descriptor(v, Hkv, D, (tile, D)),
            o, lse, cu, o.stride(0), o.stride(1), lse.stride(0), 0.125, sched, s["W"], s["G"], s["SEC"], s["NMB"], s["HP"])
    cfg = g.config()
    kw = dict(GROUP=Hq // Hkv, D=D, TILE=tile, TPS=512 // tile, STAGES=cfg["k_stages"], STORE_LSE=True,
              REV=cfg["rev"], PP=cfg["pp"], DYN=True, num_warps=4, enable_fp_fusion=False)
    fn = g._attn_fwd_gluon_wsp
    names = [p.name for p in fn.params]
    sig = {n: mangle_type(a) for n, a in zip(names, args)}
    cx = {n: kw[n] for n in names if n in kw}
    sig.update({n: "constexpr" for n in cx})
    ck = triton.compile(GluonASTSource(fn, sig, constexprs=cx), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4, "enable_fp_fusion": False})
    kern = types.SimpleNamespace(src=ck.src, metadata=ck.metadata, function=0x1234)
    ap, vals, ckw = NL.layout(fn, args, kw)
    assert vals == tuple(args) and ckw == kw
    plan, why = NL.plan(ap, vals, ckw, kern)
    assert plan, why
    assert plan[0][:3] == [NL.GP_DESC] * 3 and plan[3] == 12 and not plan[5]
    grid = (s["P"], 1, 1)
    m.invalidate()
    assert m.glearn(fn, grid, args, kw, plan) is True

    def want(a):
        out = launcher_params(a[:3]) + [(NL.GP_PTR, t.data_ptr()) for t in a[3:6]] + [(NL.GP_I32, x) for x in a[6:9]]
        struct = __import__("struct")
        out.append((NL.GP_F32, struct.unpack("<I", struct.pack("<f", a[9]))[0]))
        return out + [(NL.GP_PTR, a[10].data_ptr())] + [(NL.GP_I32, x) for x in a[11:]]

    assert m.gderive(fn, grid, args, kw, False) == want(args)
    # another call of the class: another query tensor, T still not a multiple of 16; one that is: another class
    q2 = torch.randn(T + 208, Hq, D).to(torch.bfloat16)
    args2 = (g._descriptor(q2, Hq, D, (64, D)),) + args[1:]
    assert m.gderive(fn, grid, args2, kw, False) == want(args2)
    q3 = torch.randn(T + 200, Hq, D).to(torch.bfloat16)
    assert m.gderive(fn, grid, (g._descriptor(q3, Hq, D, (64, D)),) + args[1:], kw, False) is None
    from triton.experimental.gluon import language as gl

    d0 = args[0]
    other = type(d0)(d0.base, d0.shape, d0.strides, d0.block_shape,
                     gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2))
    assert m.gderive(fn, grid, (other,) + args[1:], kw, False) is None
    m.invalidate()


def _tma_gemm_recipes(m, sm90_tik_v2):
    """The public linear's recipe for the GEMM's TMA configurations compiled for sm_90 (one program per
    tile, persistent; with and without bias): each descriptor is the map of its operand followed by that
    operand's sizes (i32) and strides (i64), every other parameter the operand pointer or constant Triton
    passes, in signature order; the C side derives exactly that for the recorded output."""
    from benchmarks.compile_attention_sm90 import compile_launch

    G = sm90_tik_v2("gemm")
    for M, N, K, bias, kname in ((256, 2048, 1536, True, "_linear_tma_kernel"),
                                 (1024, 1536, 1536, False, "_linear_tma_persistent_kernel")):
        x = torch.randn(M, K).to(torch.bfloat16)
        w = torch.randn(N, K).to(torch.bfloat16)
        b = torch.randn(N).to(torch.bfloat16) if bias else None
        y = torch.empty(M, N, dtype=torch.bfloat16)
        (fn, grid, args, kw), = _captured(sm90_tik_v2, lambda: G.linear(x, w, b, out=y))
        assert fn.fn.__name__ == kname
        ck = compile_launch(fn, args, dict(kw))
        kern = types.SimpleNamespace(src=ck.src, metadata=ck.metadata, function=0x1234)
        table = {"linear_kernels": [kname]}
        orig = native.host_path_table
        native.host_path_table = lambda: table
        try:
            recipe, why = native.linear_recipe({}, x, w, b, y, [(fn, grid, args, kw, kern)])
        finally:
            native.host_path_table = orig
        assert recipe is not None, why
        params = recipe[1]
        descs = [v for k, v in params if k == native.R_DESC]
        assert [d[0] for d in descs] == [native.R_X, native.R_W, native.R_Y]
        for d, t in zip(descs, (x, w, y)):
            assert d[6] == tuple(t.shape) and d[7] == tuple(t.stride())
        m.invalidate()
        assert m.learn_linear(x, w, b, recipe, None) is True
        want = launcher_params(args)
        assert m.linear_derive(x, w, b, y, (), False) == want
        # another output buffer: only its pointer (and its map) change
        y2 = torch.empty_like(y)
        got = m.linear_derive(x, w, b, y2, (), False)
        assert got == [(k, y2.data_ptr() if (k, v) == (NL.GP_PTR, y.data_ptr()) else v) for k, v in want]
        # the refused kind stays refused; a mismatched temporaries tuple is an error, not a silent launch
        with pytest.raises(ValueError, match="temporaries"):
            m.linear_derive(x, w, b, y, (y,), False)
        m.learn_linear(x, w, b, None, "test")
        assert m.linear_derive(x, w, b, y, (), False) is None
        m.invalidate()


def _jit_params(spec):
    return [types.SimpleNamespace(name=n, is_constexpr=c, default=d) for n, c, d in spec]


def test_plan_and_layout_of_calling_conventions(monkeypatch):
    """Runtime parameters after the positional ones (by keyword or left to their default) are appended in
    parameter order; a declared constexpr passed positionally, a runtime parameter among the options, clusters
    and unknown parameter types are refused."""
    md = types.SimpleNamespace(num_ctas=1, num_warps=4, shared=0, launch_pdl=True, launch_cooperative_grid=False,
                               global_scratch_size=0, profile_scratch_size=0, tensordesc_meta=None)
    sig = {"X": "*bf16", "n": "i32", "B": "constexpr", "V": "*fp32", "s": "i32"}
    kern = types.SimpleNamespace(src=types.SimpleNamespace(signature=sig), metadata=md, function=1)
    class Kernel:
        params = _jit_params([("X", False, None), ("n", False, None), ("B", True, None), ("V", False, None),
                              ("s", False, 0)])

    fn = Kernel()
    monkeypatch.setattr(NL, "TRAILING", {})
    t, v = torch.empty(4), torch.empty(2)
    ap, vals, ckw = NL.layout(fn, (t, 3), {"B": 4, "V": v})
    assert [p.name for p in ap] == ["X", "n", "V", "s"] and vals == (t, 3, v, 0) and ckw == {"B": 4}
    assert NL.TRAILING[fn][:2] == (2, (("V", None), ("s", 0)))
    assert NL.plan(ap, vals, ckw, kern)[0][0] == [NL.GP_PTR, NL.GP_I32, NL.GP_PTR, NL.GP_I32]
    ap2, vals2, _ = NL.layout(fn, (t, 3), {"B": 4, "s": 5})  # V left to None: a constexpr in that variant
    assert vals2 == (t, 3, None, 5)
    sig_none = dict(sig, V="constexpr")
    kern2 = types.SimpleNamespace(src=types.SimpleNamespace(signature=sig_none), metadata=md, function=1)
    assert NL.plan(ap2, vals2, {"B": 4}, kern2)[0][0] == [NL.GP_PTR, NL.GP_I32, NL.GP_DROP, NL.GP_I32]
    assert NL.plan(fn.params[:3], (t, 3, 4), {}, kern) == (False, "constexpr B passed positionally")
    assert NL.plan(ap, vals, {"B": 4, "n": 3}, kern) == (False, "runtime parameter n among the keyword options")
    assert NL.plan(ap, vals, ckw, types.SimpleNamespace(
        src=kern.src, metadata=types.SimpleNamespace(**{**vars(md), "num_ctas": 2}), function=1))[0] is None
    sig2 = dict(sig, n="u64")
    assert NL.plan(ap, vals, ckw, types.SimpleNamespace(src=types.SimpleNamespace(signature=sig2), metadata=md,
                                                        function=1)) == (None, "parameter n of type u64")


class _FakeNative:
    def __init__(self):
        self.variants, self.learned = {}, []

    def glaunch(self, fn, grid, args, kw):
        return self.variants.get((fn, len(args)), False)

    def glearn(self, fn, grid, args, kw, plan, reason=None):
        self.learned.append((fn, plan, reason))
        return True


def test_installed_wrapper_learns_then_serves(monkeypatch):
    mod = types.ModuleType("fake_rowops")
    calls = []

    def py_launch(fn, grid, *args, **kw):
        calls.append((fn, grid, args, kw))
        return "kernel-from-triton"

    mod._launch = py_launch
    NL.install(mod, "_launch")
    assert mod._launch.__wrapped__ is py_launch
    NL.install(mod, "_launch")  # idempotent
    assert mod._launch.__wrapped__ is py_launch
    fake = _FakeNative()
    monkeypatch.setitem(NL._STATE, "m", fake)
    learned = []
    monkeypatch.setattr(NL, "learn", lambda m, fn, grid, args, kw, k: learned.append((fn, k)) or (True, ""))
    class Kernel:
        pre_run_hooks: list = []

    fn = Kernel()
    assert mod._launch(fn, (1,), 1, 2, A=3) == "kernel-from-triton"
    assert len(calls) == 1 and learned == [(fn, "kernel-from-triton")]
    fake.variants[(fn, 2)] = "kernel-native"
    assert mod._launch(fn, (1,), 1, 2, A=3) == "kernel-native"
    assert len(calls) == 1
    # a pre-run hook, or a kernel refused for its calling convention: Triton's path, nothing learned
    fn.pre_run_hooks = [lambda *a, **k: None]
    assert mod._launch(fn, (1,), 1, 2) == "kernel-from-triton"
    fn.pre_run_hooks = []
    monkeypatch.setitem(NL.REFUSED_KERNELS, fn, "why")
    assert mod._launch(fn, (1,), 1, 2) == "kernel-from-triton" and len(learned) == 1
    # without the native module every call takes the wrapped path
    monkeypatch.setitem(NL._STATE, "m", None)
    assert mod._launch(fn, (1,), 1, 2) == "kernel-from-triton"


@needs_triton36
def test_gluon_descriptor_class_holds_its_layout(m):
    """Two Gluon descriptors that differ only in their layout are two classes (two kernels); an equal layout
    built again is the same class."""
    vals = _gluon_values(torch.empty(4096, dtype=torch.bfloat16))
    fn = object()
    m.invalidate()
    assert m.glearn(fn, (1,), (vals[0],), {}, ([NL.GP_DROP], [], 0, 4, 0, False, False, None)) is True
    assert m.gderive(fn, (1,), (vals[3],), {}, False) is not None   # the same layout, rebuilt
    assert m.gderive(fn, (1,), (vals[2],), {}, False) is None       # another swizzle
    assert _triton_key(vals[0]) != _triton_key(vals[2])
    m.invalidate()


def test_packed_wrapper_learns_from_tritons_cache_then_serves(monkeypatch):
    """A helper taking (fn, grid, args, kw) and returning nothing (attention_gluon's): the variant is learned
    from the kernel Triton's cache holds for that call, then served; a kernel with trailing defaults stays on
    the helper."""
    mod = types.ModuleType("fake_gluon")
    calls = []

    def py_launch(fn, grid, args, kw):
        calls.append((fn, grid, args, kw))

    mod._launch = py_launch
    NL.install(mod, "_launch", True)
    assert mod._launch.__wrapped__ is py_launch
    NL.install(mod, "_launch", True)
    assert mod._launch.__wrapped__ is py_launch
    fake = _FakeNative()
    monkeypatch.setitem(NL._STATE, "m", fake)
    learned = []
    monkeypatch.setattr(NL, "learn", lambda m, fn, grid, args, kw, k: learned.append((fn, args, kw, k)) or (True, ""))
    monkeypatch.setattr(NL, "compiled_kernel", lambda fn, args, kw: "kernel-in-cache")

    class Kernel:
        pre_run_hooks: list = []

    fn = Kernel()
    assert mod._launch(fn, (1,), (1, 2), {"A": 3}) == "kernel-in-cache"
    assert len(calls) == 1 and learned == [(fn, (1, 2), {"A": 3}, "kernel-in-cache")]
    fake.variants[(fn, 2)] = "kernel-native"
    assert mod._launch(fn, (1,), (1, 2), {"A": 3}) == "kernel-native" and len(calls) == 1
    monkeypatch.setitem(NL.TRAILING, fn, (2, (("X", 0),), frozenset({"X"})))
    assert mod._launch(fn, (1,), (1, 2), {"A": 3}) is None and len(calls) == 2
    monkeypatch.setitem(NL._STATE, "m", None)
    assert mod._launch(fn, (1,), (1, 2), {}) is None and len(calls) == 3 and len(learned) == 1


def test_compiled_kernel_is_none_before_a_compile():
    import triton
    import triton.language as tl

    @triton.jit
    def k(x, n: tl.constexpr):
        pass

    assert NL.compiled_kernel(k, (torch.empty(1),), {"n": 1}) is None


def test_loader_wraps_tik_v6s_gluon_launch():
    """tik_v6's manifest names attention_gluon._launch as a packed helper: loading the implementation wraps it."""
    impl = loader.load_implementation(loader.resolve_path("tik_v6"))
    impl.module("attention")
    assert impl.manifest["native_host_path"]["launch_packed"] == ["attention_gluon:_launch"]
    g = sys.modules[f"{impl.package}.attention_gluon"]
    if not loader._LAUNCH_LISTENERS:
        pytest.skip("the native launcher is not registered in this process")
    assert getattr(g._launch, "__tik_native_launch__", False) and callable(g._launch.__wrapped__)


def test_loader_installs_the_wrapper_where_the_manifest_says():
    impl = loader.get_implementation()
    spec = impl.manifest["native_host_path"]["launch"]
    name, _, attr = spec.partition(":")
    f = getattr(impl.module(name), attr)
    assert getattr(f, "__tik_native_launch__", False) and callable(f.__wrapped__)


def test_host_probe_process_has_tik_v6s_helpers_wrapped():
    """A probe that times the host path must register the launch hook before its kernels load (the loader does
    not import it): in a fresh process, importing tma_host_probe and loading tik_v6 leaves both helpers wrapped."""
    import subprocess

    code = ("import os, sys; os.environ['TIK_IMPLEMENTATION'] = 'tik_v6'\n"
            "import benchmarks.probes.tma_host_probe\n"
            "from areal_tik_plugin.runtime import loader\n"
            "impl = loader.get_implementation(); impl.module('attention')\n"
            "sys.exit(0 if all(getattr(loader.current_module(m)._launch, '__tik_native_launch__', False)\n"
            "                  for m in ('attention_gluon', '_rowops')) else 1)\n")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]

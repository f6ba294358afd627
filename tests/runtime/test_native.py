"""The native host path (areal_tik_plugin.runtime.native) on the CPU: it builds, and its launch derivation equals
the launch the kernel modules record, parameter for parameter, for odd shapes, per-head views, the
residual variant, one-row calls and strided rows. learn() registers a plan only when the derivation
matches the record typed by Triton's own specialization rule, refuses otherwise, and any knob change
drops the plans. (Launching needs a GPU: the GPU suites check the bits and time the host path.)"""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from areal_tik_plugin.runtime import loader, native
from tests.helpers.native_build import build_native, needs_triton36

@pytest.fixture(scope="module")
def m(tmp_path_factory):
    mod = build_native(tmp_path_factory)
    mod.setup_cpu(torch)
    yield mod
    mod.invalidate()


def _bound(fn, args, kw):
    f = getattr(fn, "fn", fn)
    sig = inspect.signature(f)
    b = sig.bind(*args, **{k: v for k, v in kw.items() if k in sig.parameters})
    b.apply_defaults()
    return b.arguments


def _triton_types(fn, args, kw):
    """Per parameter, Triton 3.6's own (type, key) for the recorded value (its binder's rule)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    out = {}
    params = {p.name: p for p in native.kernel_params(fn)}
    for name, v in _bound(fn, args, kw).items():
        p = params[name]
        if p.is_constexpr:
            out[name] = "constexpr"
            continue
        out[name] = native_specialize_impl(BaseBackend, v, False, not p.do_not_specialize,
                                           not p.do_not_specialize_on_alignment)[0]
    return out


def _record(mod_name, call):
    rowops = loader.current_module("_rowops")
    out, rec = native.recorded(rowops._RECORDS, call)
    assert len(rec) == 1, rec
    return out, rec[0]


def _expected_params(fn, args, kw):
    """[(type, value)] of the record's kernel parameters (Triton's types; constexprs left out)."""
    types_ = _triton_types(fn, args, kw)
    vals = _bound(fn, args, kw)
    return [(types_[n], v.data_ptr() if isinstance(v, torch.Tensor) else v)
            for n, v in vals.items() if types_[n] != "constexpr"]


def _check(m, op, inputs, outputs, rec, cfg_name):
    fn, grid, args, kw, _k = rec
    got = m.derive(op, inputs, outputs, int(kw[cfg_name]))
    assert got is not None, "derive() did not handle inputs the kernel module launched in place"
    dgrid, dparams = got
    assert dgrid == tuple(grid) + (1,) * (3 - len(grid))
    passed = [(kind, v) for kind, v, constexpr, _cls in dparams if not constexpr]
    want = _expected_params(fn, args, kw)
    assert len(passed) == len(want), (passed, want)
    for (kind, v), (ty, w) in zip(passed, want):
        assert (kind == "ptr") == ty.startswith("*") and (kind in ("i32", "i64", "fp32")) == (not ty.startswith("*"))
        if kind != "ptr":
            assert kind == ty, (kind, ty)
        if kind == "fp32":
            assert float(torch.tensor(v, dtype=torch.float32)) == float(torch.tensor(w, dtype=torch.float32))
        else:
            assert v == w, (kind, v, w)
    return fn, grid, args, kw


def _fake_kernel(fn, args, kw):
    return types.SimpleNamespace(
        src=types.SimpleNamespace(signature=_triton_types(fn, args, kw)),
        metadata=types.SimpleNamespace(num_warps=4, num_ctas=1, shared=0, launch_pdl=True,
                                       launch_cooperative_grid=False, global_scratch_size=0, profile_scratch_size=0),
        function=0x1234)


RMS_CASES = [  # (name, x builder, with residual)
    ("2d_odd", lambda dt: torch.randn(5, 33, dtype=dt), False),
    ("2d_odd_res", lambda dt: torch.randn(7, 40, dtype=dt), True),
    ("one_row", lambda dt: torch.randn(1, 64, dtype=dt), True),
    ("3d", lambda dt: torch.randn(2, 3, 24, dtype=dt), True),
    ("1d", lambda dt: torch.randn(48, dtype=dt), False),
    # per-head Q/K norm over a strided slice of a fused QKV output: [T, NH, D] read in place
    ("qk_view", lambda dt: torch.randn(3, (4 + 2 + 2) * 16, dtype=dt)[:, : 4 * 16].view(3, 4, 16), False),
    ("strided_rows", lambda dt: torch.randn(6, 80, dtype=dt)[::2, :32], True),
]


@needs_triton36
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name,make,res", RMS_CASES, ids=[c[0] for c in RMS_CASES])
def test_rmsnorm_derive_equals_recorded_launch(m, name, make, res, dt):
    impl = loader.current_module("rmsnorm")
    torch.manual_seed(0)
    x = make(dt)
    H = x.shape[-1]
    w = torch.randn(H, dtype=dt)
    r = torch.randn(x.shape, dtype=dt) if res else None
    eps = 1e-6
    out, rec = _record("rmsnorm", lambda: impl.forward(x, w, eps, residual=r))
    outputs = out if isinstance(out, tuple) else (out,)
    _check(m, "rmsnorm", (x, w, eps, r), outputs, rec, "ROWS")


def test_rmsnorm_copied_view_is_not_handled(m):
    """A view the kernel module copies (misaligned start) is left to the Python path."""
    impl = loader.current_module("rmsnorm")
    base = torch.randn(4 * 33 + 1, dtype=torch.bfloat16)
    x = base[1:].view(4, 33)
    w = torch.randn(33, dtype=torch.bfloat16)
    y = impl.forward(x, w, 1e-6)
    assert m.derive("rmsnorm", (x, w, 1e-6, None), (y,), 1) is None


SWIGLU_CASES = [  # (name, shape of gate_up)
    ("T1", (1, 2 * 24)),
    ("T1_odd", (1, 2 * 7)),
    ("T3_odd", (3, 2 * 13)),
    ("T5", (5, 2 * 32)),
    ("3d", (2, 3, 2 * 16)),
    ("3d_one_row", (1, 1, 2 * 16)),
    ("1d", (2 * 40,)),
]


@needs_triton36
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name,shape", SWIGLU_CASES, ids=[c[0] for c in SWIGLU_CASES])
def test_swiglu_derive_equals_recorded_launch(m, name, shape, dt):
    impl = loader.current_module("swiglu")
    torch.manual_seed(0)
    gu = torch.randn(shape, dtype=dt)
    out, rec = _record("swiglu", lambda: impl.forward_fused(gu))
    _check(m, "swiglu_fused", (gu,), (out,), rec, "BLOCK")
    I = shape[-1] // 2
    g, u = gu[..., :I].contiguous(), gu[..., I:].contiguous()
    out2, rec2 = _record("swiglu", lambda: impl.forward(g, u))
    _check(m, "swiglu", (g, u), (out2,), rec2, "BLOCK")


@needs_triton36
def test_learn_registers_matching_and_refuses_others(m):
    m.invalidate()
    impl = loader.current_module("swiglu")
    gu = torch.randn(3, 2 * 13, dtype=torch.bfloat16)
    out, (fn, grid, args, kw, _) = _record("swiglu", lambda: impl.forward_fused(gu))
    k = _fake_kernel(fn, args, kw)
    ok, why = native.learn(m, "swiglu_fused", (gu,), (out,), [(fn, grid, args, kw, k)])
    assert ok, why
    plans = m.stats()["plans"]
    assert len(plans) == 1 and not plans[0]["refused"] and plans[0]["pdl"] == 1

    # a record whose grid differs from the derivation: refused, with the reason kept
    m.invalidate()
    bad_grid = (grid[0] + 1,) + tuple(grid[1:])
    ok, why = native.learn(m, "swiglu_fused", (gu,), (out,), [(fn, bad_grid, args, kw, k)])
    assert not ok and "grid" in why
    assert m.stats()["plans"][0]["refused"]

    # a parameter that differs (another output pointer): refused
    m.invalidate()
    other = torch.empty_like(out)
    ok, why = native.learn(m, "swiglu_fused", (gu,), (other,), [(fn, grid, args, kw, k)])
    assert not ok and "pointer" in why

    # a kernel that needs scratch memory, or two launches: refused
    m.invalidate()
    k2 = _fake_kernel(fn, args, kw)
    k2.metadata.global_scratch_size = 128
    assert native.learn(m, "swiglu_fused", (gu,), (out,), [(fn, grid, args, kw, k2)]) == (False, "kernel needs scratch memory")
    m.invalidate()
    ok, why = native.learn(m, "swiglu_fused", (gu,), (out,), [(fn, grid, args, kw, k)] * 2)
    assert not ok and "2 launches" in why
    assert m.stats()["plans"][0]["refused"]
    m.invalidate()
    assert m.stats()["plans"] == []


@needs_triton36
def test_learn_checks_specialization_flags(m):
    """A kernel whose integer arguments are specialized differently from what the C side assumes."""
    m.invalidate()
    impl = loader.current_module("rmsnorm")
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    w = torch.randn(32, dtype=torch.bfloat16)
    out, (fn, grid, args, kw, _) = _record("rmsnorm", lambda: impl.forward(x, w, 1e-6))
    k = _fake_kernel(fn, args, kw)
    entry = native.host_path_table()["kernels"]["rmsnorm"]
    saved = list(entry["do_not_specialize"])
    entry["do_not_specialize"] = [n for n in saved if n != "M"]
    try:
        ok, why = native.learn(m, "rmsnorm", (x, w, 1e-6, None), (out,), [(fn, grid, args, kw, k)])
    finally:
        entry["do_not_specialize"] = saved
    assert not ok and "specialization" in why
    m.invalidate()
    ok, why = native.learn(m, "rmsnorm", (x, w, 1e-6, None), (out,), [(fn, grid, args, kw, k)])
    assert ok, why
    m.invalidate()


@needs_triton36
def test_knob_change_drops_plans(m, monkeypatch):
    impl = loader.current_module("swiglu")
    assert isinstance(impl, loader.GuardedModule)
    assert isinstance(loader.current_module("_rowops"), loader.GuardedModule)
    gu = torch.randn(2, 2 * 16, dtype=torch.bfloat16)
    out, (fn, grid, args, kw, _) = _record("swiglu", lambda: impl.forward_fused(gu))
    monkeypatch.setattr(native, "_MOD", m)
    m.invalidate()
    assert native.learn(m, "swiglu_fused", (gu,), (out,), [(fn, grid, args, kw, _fake_kernel(fn, args, kw))])[0]
    assert len(m.stats()["plans"]) == 1
    monkeypatch.setattr(impl, "BLOCK", impl.BLOCK)  # any attribute set on an implementation module
    assert m.stats()["plans"] == []


def test_policy_values(monkeypatch):
    monkeypatch.setenv("TIK_NATIVE", "yes")
    with pytest.raises(ValueError, match="TIK_NATIVE: expected auto, 0 or 1"):
        native._policy()
    monkeypatch.setenv("TIK_NATIVE", "0")
    assert native._policy() == "0"


def test_off_without_cuda_and_required_is_an_error(monkeypatch):
    """On a machine without CUDA the path is off (auto) and TIK_NATIVE=1 says why it cannot be on."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    monkeypatch.setattr(native, "_MOD", native._UNSET)
    monkeypatch.setenv("TIK_NATIVE", "auto")
    assert native.module() is None
    monkeypatch.setattr(native, "_MOD", native._UNSET)
    monkeypatch.setenv("TIK_NATIVE", "1")
    with pytest.raises(native.NativeBuildError, match="no CUDA device"):
        native.module()
    monkeypatch.setattr(native, "_MOD", native._UNSET)


def test_fast_entry_points_decline_without_setup(m):
    """setup_cpu() leaves the launch entry points off: every call is left to the Python path."""
    x = torch.randn(2, 8)
    assert m.rmsnorm(x, torch.ones(8), 1e-6, None) is None
    assert m.swiglu_fused(torch.randn(2, 16)) is None


def _linear_record(x, w, b=None):
    impl = loader.current_module("gemm")
    return _record("gemm", lambda: impl.linear(x, w, b))


@pytest.mark.parametrize("M,N,K,bias", [(1, 24, 40, False), (3, 40, 24, True), (5, 17, 4100, False),
                                        (2, 33, 4100, True)])
@needs_triton36
def test_linear_recipe_maps_every_parameter(m, M, N, K, bias):
    """The recipe read off a recorded GEMM launch: operands by pointer, the partials buffer as a temporary,
    the tickets as the fixed buffer of their stream, every integer a constant equal to the recorded one."""
    torch.manual_seed(0)
    rowops = loader.current_module("_rowops")
    x, w = torch.randn(M, K, dtype=torch.bfloat16), torch.randn(N, K, dtype=torch.bfloat16)
    b = torch.randn(N, dtype=torch.float32) if bias else None
    y, (fn, grid, args, kw, _) = _linear_record(x, w, b)
    k = _fake_kernel(fn, args, kw)
    bound = _bound(fn, args, kw)
    cnt = bound.get("CNT")
    key = (-1, 7)
    if isinstance(cnt, torch.Tensor):  # on the GPU the tickets come from _rowops.tickets (per device and stream)
        rowops._TICKETS[key] = cnt
    try:
        recipe, why = native.linear_recipe(rowops._TICKETS, x, w, b, y, [(fn, grid, args, kw, k)])
    finally:
        rowops._TICKETS.pop(key, None)
    assert recipe is not None, why
    g, params, temps, stream, *_ = recipe
    assert g == tuple(grid) + (1,) * (3 - len(grid))
    want = _expected_params(fn, args, kw)
    assert len(params) == len(want)
    ptr_of = {native.R_X: x.data_ptr(), native.R_W: w.data_ptr(), native.R_Y: y.data_ptr()}
    if b is not None:
        ptr_of[native.R_B] = b.data_ptr()
    for (kind, v), (ty, wv) in zip(params, want):
        if kind in ptr_of:
            assert ty.startswith("*") and ptr_of[kind] == wv
        elif kind == native.R_TMP:
            assert ty == "*fp32" and temps[v][1] == 2
        elif kind == native.R_FIXED:
            assert v == cnt.data_ptr() == wv and stream == 7
        else:
            assert {native.R_I32: "i32", native.R_I64: "i64", native.R_F32: "fp32"}[kind] == ty and v == wv
    split = isinstance(cnt, torch.Tensor)
    assert (fn.__name__ == "_linear_partial_kernel") == split
    if split:
        assert temps and temps[0][0] == tuple(bound["P"].shape)
    m.invalidate()
    assert m.learn_linear(x, w, b, recipe, None) is True
    assert m.stats()["linear"] == {"plans": 1, "refused": 0}
    m.invalidate()


@pytest.mark.parametrize("M,N,K,bias", [(3, 40, 24, True), (5, 17, 4100, False)])
@needs_triton36
def test_linear_recipe_checked_against_tritons_parameters(m, M, N, K, bias):
    """At its first call a recipe is checked: the parameters C derives for the recorded call (its output
    and temporaries) equal those Triton's launcher passed; a recipe with one constant off is reported."""
    torch.manual_seed(0)
    rowops = loader.current_module("_rowops")
    x, w = torch.randn(M, K, dtype=torch.bfloat16), torch.randn(N, K, dtype=torch.bfloat16)
    b = torch.randn(N, dtype=torch.float32) if bias else None
    y, (fn, grid, args, kw, _) = _linear_record(x, w, b)
    rec = [(fn, grid, args, kw, _fake_kernel(fn, args, kw))]
    cnt = _bound(fn, args, kw).get("CNT")
    key = (-1, 7)
    if isinstance(cnt, torch.Tensor):
        rowops._TICKETS[key] = cnt
    try:
        temps = []
        recipe, why = native.linear_recipe(rowops._TICKETS, x, w, b, y, rec, temps)
    finally:
        rowops._TICKETS.pop(key, None)
    assert recipe is not None, why
    assert len(temps) == sum(1 for k, _ in recipe[1] if k == native.R_TMP)
    m.invalidate()
    assert m.learn_linear(x, w, b, recipe, None) is True
    # the interpreter's kernel has no .params: Triton's parameter view of the same function
    sig = inspect.signature(getattr(fn, "fn", fn))
    params = [types.SimpleNamespace(name=n, is_constexpr="constexpr" in str(p.annotation),
                                    default=None if p.default is inspect.Parameter.empty else p.default)
              for n, p in sig.parameters.items()]
    view = type("KernelParams", (), {"params": params, "__name__": fn.__name__})()
    rec = [(view,) + tuple(rec[0][1:])]
    assert native.check_linear_recipe(m, x, w, b, y, rec, temps) == ""
    i = next(i for i, (k, _) in enumerate(recipe[1]) if k == native.R_I32)
    bad = list(recipe)
    bad[1] = [(k, v + 1) if j == i else (k, v) for j, (k, v) in enumerate(recipe[1])]
    m.invalidate()
    assert m.learn_linear(x, w, b, tuple(bad), None) is True
    assert native.check_linear_recipe(m, x, w, b, y, rec, temps) == f"derived parameter {i} differs from Triton's"
    m.invalidate()


@needs_triton36
def test_linear_recipe_refuses_unknown_buffers_and_kernels(m):
    """A tensor parameter that is no operand, float temporary or registered ticket buffer (here: the
    tickets when they are not the per-stream buffer) is refused, and so is a kernel not served natively."""
    rowops = loader.current_module("_rowops")
    x, w = torch.randn(2, 4100, dtype=torch.bfloat16), torch.randn(8, 4100, dtype=torch.bfloat16)
    y, (fn, grid, args, kw, _) = _linear_record(x, w)
    k = _fake_kernel(fn, args, kw)
    recipe, why = native.linear_recipe(rowops._TICKETS, x, w, None, y, [(fn, grid, args, kw, k)])
    assert recipe is None and "CNT" in why
    recipe, why = native.linear_recipe(rowops._TICKETS, x, w, None, y, [])
    assert recipe is None and "0 launches" in why
    m.invalidate()
    assert m.learn_linear(x, w, None, None, why) is False
    assert m.stats()["linear"] == {"plans": 1, "refused": 1}
    m.invalidate()
    assert m.linear(x, w, None) is None  # setup_cpu: the launch entry points stay off


class _FakeNative:
    """Stands in for the C module on the CPU: answers each entry point from a script (result / False / None)
    and records what the ops ask it to learn."""

    def __init__(self, answer):
        self.answer, self.calls, self.learned = answer, [], []

    def _entry(self, name, *args):
        self.calls.append(name)
        a = self.answer(name, args)
        return a

    def rmsnorm(self, *a):
        return self._entry("rmsnorm", *a)

    def swiglu(self, *a):
        return self._entry("swiglu", *a)

    def swiglu_fused(self, *a):
        return self._entry("swiglu_fused", *a)

    def linear(self, *a):
        return self._entry("linear", *a)

    def learn(self, op, inputs, outputs, cfg, grid, params, info, refuse=None):
        self.learned.append((op, refuse, len(params)))
        return (refuse is None, refuse or "")

    def learn_linear(self, x, w, b, recipe, reason=None):
        self.learned.append(("linear", reason, recipe is not None))
        return recipe is not None

    def invalidate(self):
        pass


def _public_calls():
    from areal_tik_plugin import ops

    torch.manual_seed(0)
    x, r, w = torch.randn(3, 32), torch.randn(3, 32), torch.randn(32)
    gu = torch.randn(3, 2 * 16)
    xl, wl = torch.randn(3, 24, dtype=torch.bfloat16), torch.randn(8, 24, dtype=torch.bfloat16)
    return {
        "rmsnorm": lambda: ops.rms_norm(x, w, 1e-6),
        "rmsnorm_res": lambda: ops.rms_norm_residual(x, r, w, 1e-6),
        "swiglu_fused": lambda: ops.swiglu_fused(gu),
        "swiglu": lambda: ops.swiglu(gu[:, :16], gu[:, 16:]),
        "linear": lambda: ops.linear(xl, wl),
    }


@pytest.mark.parametrize("case", ["rmsnorm", "rmsnorm_res", "swiglu_fused", "swiglu", "linear"])
def test_ops_control_flow_with_a_native_module(monkeypatch, case):
    """The public op (the integrations' entry point too): a served result is returned as is; a miss runs the
    Python path (same result as without the native module) with its launch recorded and asks the module to
    learn it; None leaves the call to the Python path without learning."""
    calls = (_public_calls()[case],)
    ref = [c() for c in calls]  # the native path is off on the CPU: the Python path's results
    sentinel = object()
    for i, call in enumerate(calls):
        fake = _FakeNative(lambda name, args: sentinel)
        monkeypatch.setattr(native, "_MOD", fake)
        assert call() is sentinel and fake.learned == []
        fake = _FakeNative(lambda name, args: False)
        monkeypatch.setattr(native, "_MOD", fake)
        got = call()
        for a, b in zip(got if isinstance(got, tuple) else (got,), ref[i] if isinstance(ref[i], tuple) else (ref[i],)):
            assert torch.equal(a, b)
        assert len(fake.learned) == 1, fake.learned  # interpreter launches have no compiled kernel: refused
        assert fake.learned[0][1] is not None
        fake = _FakeNative(lambda name, args: None)
        monkeypatch.setattr(native, "_MOD", fake)
        got = call()
        assert fake.learned == [] and fake.calls
    monkeypatch.setattr(native, "_MOD", native._UNSET)


def test_autograd_forward_uses_the_native_module(monkeypatch):
    """Inside autograd's forward (grad mode off there) the kernel call goes to the native module too; the
    backward is unchanged."""
    from areal_tik_plugin import ops

    x = torch.randn(3, 32, requires_grad=True)
    w = torch.randn(32, requires_grad=True)
    ref = ops.rms_norm(x, w, 1e-6)
    fake = _FakeNative(lambda name, args: None if torch.is_grad_enabled() and args[0].requires_grad else False)
    monkeypatch.setattr(native, "_MOD", fake)
    y = ops.rms_norm(x, w, 1e-6)
    assert fake.calls == ["rmsnorm", "rmsnorm"] and len(fake.learned) == 1
    assert torch.equal(y, ref) and y.grad_fn is not None
    y.sum().backward()
    assert x.grad is not None and w.grad is not None
    monkeypatch.setattr(native, "_MOD", native._UNSET)

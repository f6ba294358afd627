"""kernels/tik_v19: tik_v18 with its Gluon attention backward warp-specialized (two consumer warpgroups, a producer
warp for the loads and the dQ reduce-adds, per-warpgroup barriers and one cross-warpgroup wait a tile pair), and the
fixed point's norms bounded by powers of two instead of sqrt (tik search's per-path instruction check refuses a
sqrt that only the backward runs: the CPU plan run of benchmarks/search_plans/h200_train/bwd_gluon).

Gluon has no CPU interpreter, so here: the folder is tik_v18 with attention_bwd_gluon.py and the bound's two kernels
changed; the kernel compiles for sm_90 with TMA loads, wgmma (two consumers' worth) and the TMA reduce-add; on the
CPU the backward runs the int32 fused Triton kernel, as accurate as tik_v18's with the looser bound, repeatably (the
edges of the fixed-point range and NaN inputs: tests/kernels/test_tik_v17.py, parametrized over tik_v19 too). Its gradients and times on the GPU: ``bash
benchmarks/gpu_bwd_gluon.sh --impl tik_v19``."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.search import edits as E
from tests.helpers.folders import jit_functions
from tests.helpers.scripts import ptxas_available
from tests.kernels.test_tik_v17 import _cu, _inputs, _reference
from tests.kernels.test_tik_v18 import compile_quick

ROOT = pathlib.Path(__file__).resolve().parents[2]
V18, V19 = ROOT / "kernels" / "tik_v18", ROOT / "kernels" / "tik_v19"


def test_tik_v19_changes_only_the_backward():
    a, b = E.read_files(str(V18)), E.read_files(str(V19))
    assert sorted(r for r in b if r.endswith(".py")) == sorted(r for r in a if r.endswith(".py"))
    assert [r for r in b if r.endswith(".py") and b[r] != a[r]] == ["attention.py", "attention_bwd_gluon.py"]
    j18, j19 = jit_functions(a["attention.py"]), jit_functions(b["attention.py"])
    assert set(j19) - set(j18) == {"_sqrt_ub"} and set(j18) <= set(j19)
    assert [n for n in j18 if j18[n] != j19[n]] == ["_bwd_kv_bound_kernel", "_bwd_fx_preprocess"]
    assert "sqrt" not in (j19["_bwd_kv_bound_kernel"] + j19["_bwd_fx_preprocess"]).replace("_sqrt_ub", "")
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (V18, V19))
    assert (mb["name"], mb["parent"]) == ("tik_v19", "tik_v18")
    keep = lambda m: {k: v for k, v in m.items() if k not in ("name", "parent", "source_hash")}  # noqa: E731
    assert keep(mb) == keep(ma)
    assert loader.load_implementation(str(V19)).source_hash == mb["source_hash"]
    g18, g19 = (loader.load_implementation(str(p)).module("attention_bwd_gluon") for p in (V18, V19))
    # the same tile walk, row vectors, descriptors and host entry
    for name in ("_pair_coords", "_row_vectors", "_load_pair"):
        assert getattr(g19, name).fn.__code__.co_code == getattr(g18, name).fn.__code__.co_code, name
    for name in ("_tma_add", "backward", "applies"):
        assert getattr(g19, name).__code__.co_code == getattr(g18, name).__code__.co_code, name
    assert (g19.BLOCK_N, g19.BLOCK_M, g19.WARPS) == (128, 64, 4)


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_warp_specialized_backward_compiles_for_sm90(tmp_path):
    v = compile_quick(V19, tmp_path)
    # each consumer: S and dP (8 k-steps over D), dV and dK (4 over the query rows), dQ (8 over the 128 keys)
    assert v["wgmma"] == 2 * (8 + 8 + 4 + 4 + 8), v
    assert v["smem"] <= 227 * 1024 and v["spill_bytes"] <= 256, v


def _att(folder):
    return loader.load_implementation(str(folder)).module("attention")


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize("x", [0.0, 1e-45, 2.0 ** -126, 0.3, 1.0, 2.0, 3.99, 4.0, 1e30, 3.4e38])
def test_sqrt_bound_is_a_power_of_two_within_twice_the_root(x):
    a19 = _att(V19)
    got = float(_sqrt_bound(a19, x))
    m, _ = __import__("math").frexp(got)
    assert m == 0.5 and got >= x ** 0.5 and (x < 2.0 ** -126 or got <= 2 * x ** 0.5), (x, got)


def _sqrt_bound(a19, x):
    """The kernels' _sqrt_ub through the interpreter: KVB's value factor of one value row [x ** 0.5, 0, ...]."""
    v = torch.zeros(1, 1, 16)
    v[0, 0, 0] = x ** 0.5
    kvb = torch.zeros(1, 2)
    a19.launch(a19._bwd_kv_bound_kernel, (1, 1), v, v.float(), kvb, 16, 16, 1, D=16, BLOCK=64)
    s2 = float((v.float() * v.float()).sum())
    assert s2 == pytest.approx(x, rel=1e-6, abs=1e-45) or x < 1e-37
    return kvb[0, 1]


def test_cpu_backward_meets_the_reference_as_tik_v18s_does():
    lens = [17, 70, 45]
    a18, a19 = _att(V18), _att(V19)
    q, k, v, do = _inputs(lens, seed=4)
    cu, n, scale = _cu(lens), max(lens), 32 ** -0.5
    o, lse = a19.prefill(q, k, v, cu, n, scale, return_lse=True)
    ref = _reference(q, k, v, do, lens, scale)
    got = a19.prefill_backward(do, q, k, v, o, lse, cu, n, scale)
    base = a18.prefill_backward(do, q, k, v, o, lse, cu, n, scale)
    for name, g, b, r in zip(("dq", "dk", "dv"), got, base, ref):
        assert _rel(g, r) <= 1.02 * _rel(b, r) + 1e-4, (name, _rel(g, r), _rel(b, r))
    # dK / dV do not go through the fixed point: tik_v18's bits
    assert torch.equal(got[1].view(torch.int16), base[1].view(torch.int16))
    assert torch.equal(got[2].view(torch.int16), base[2].view(torch.int16))
    again = a19.prefill_backward(do, q, k, v, o, lse, cu, n, scale)
    assert all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(got, again))

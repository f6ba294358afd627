"""kernels/tik_v18: tik_v17 with the attention backward's default on sm_90 moved to a Gluon kernel
(attention_bwd_gluon.py): 128 keys per program on two warpgroups, five wgmma per tile pair, dQ's int32 tiles sent as
TMA bulk reduce-adds that run behind the next pair's matmuls.

Gluon has no CPU interpreter, so here: the folder is tik_v17 with attention.py's backward routing changed and the
new file added; the kernel compiles for sm_90 with TMA loads, wgmma and the TMA reduce-add; its pair walk (plain
integer arithmetic, run as Python) visits every (query head, query block) of a key block once, in order; on the CPU
the default takes the int32 fused Triton kernel (the same formulas and fixed-point scale) and meets the fp64
reference as tik_v17's does, repeatably. Its gradients and times on the GPU: benchmarks/probes/attn_bwd_probe.py and
the contract suite's grad checks (benchmarks/gpu_bwd_gluon.sh)."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.search import edits as E
from tests.helpers.folders import jit_functions
from tests.helpers.scripts import ptxas_available, run_script
from tests.kernels.test_tik_v17 import _cu, _inputs, _reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
V17, V18 = ROOT / "kernels" / "tik_v17", ROOT / "kernels" / "tik_v18"


def _att(folder):
    return loader.load_implementation(str(folder)).module("attention")


def _rel(a, b):
    return float((a.double() - b).norm() / b.norm())


def test_tik_v18_is_tik_v17_with_the_backward_routed_to_the_gluon_kernel():
    a, b = E.read_files(str(V17)), E.read_files(str(V18))
    py_a, py_b = sorted(r for r in a if r.endswith(".py")), sorted(r for r in b if r.endswith(".py"))
    assert py_b == sorted(py_a + ["attention_bwd_gluon.py"])
    assert [r for r in py_a if b[r] != a[r]] == ["attention.py"]
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (V17, V18))
    assert (mb["name"], mb["parent"]) == ("tik_v18", "tik_v17")
    keep = lambda m: {k: v for k, v in m.items() if k not in ("name", "parent", "source_hash")}  # noqa: E731
    assert keep(mb) == keep(ma)
    assert loader.load_implementation(str(V18)).source_hash == mb["source_hash"]
    # every Triton kernel is tik_v17's; the Python changes are the knob and prefill_backward's routing
    assert jit_functions(b["attention.py"]) == jit_functions(a["attention.py"])
    a17, a18 = _att(V17), _att(V18)
    for name in ("prefill", "extend", "decode", "_split_backward"):
        assert getattr(a18, name).__code__.co_code == getattr(a17, name).__code__.co_code, name
    assert a18.BWD_DQ == "gluon" and a18.KNOBS["free"]["BWD_DQ"] == ("gluon", "int64", "int32", "split")


def compile_quick(folder: pathlib.Path, tmp_path) -> dict:
    """The bf16 / group-4 sm_90 compile of a folder's Gluon backward (spills up to 256 B admitted), checked for
    TMA loads, the TMA reduce-add and unserialized wgmma."""
    out = tmp_path / "b.json"
    r = run_script("compile_attention_bwd_gluon_sm90", "--impl", str(folder), "--json", str(out), "--quick",
                   "--max-spill", "256", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (v,) = json.loads(out.read_text())["variants"]
    assert v["tma_load"] and v["tma_reduce"] and not v["serialized_wgmma"], v
    return v


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_gluon_backward_compiles_for_sm90(tmp_path):
    v = compile_quick(V18, tmp_path)
    assert v["warps"] == 8, v
    # five matmuls per pair: S and dP (8 k-steps over D on each warpgroup's 64 keys), dV and dK (4 over the 64
    # query rows), dQ (8 over the 128 keys)
    assert v["wgmma"] == 8 + 8 + 4 + 4 + 8, v
    assert v["smem"] <= 227 * 1024 and v["spill_bytes"] <= 256, v


@pytest.mark.parametrize("seqlen,group", [(1, 1), (64, 4), (128, 2), (129, 4), (1000, 4), (4224, 4)])
def test_pair_walk_covers_every_query_block_once(seqlen, group):
    """The kernel's walk (run as Python): a key block's program visits (query head, query block) for every head
    of its kv head and every 64-row block from the key block on, each once, heads outermost; the row vectors'
    mask keeps rows past the sequence out (lse +inf there)."""
    g = loader.load_implementation(str(V18)).module("attention_bwd_gluon")
    BN, BM, D, start, h_kv = g.BLOCK_N, g.BLOCK_M, 128, 1000, 3
    for start_n in range(0, seqlen, BN):
        n_mb = -(-(seqlen - start_n) // BM)
        pairs = [g._pair_coords.fn(it, n_mb, start, start_n, h_kv, group, D, BM) for it in range(group * n_mb)]
        want = [(h_kv * group + gg, m) for gg in range(group) for m in range(start_n, seqlen, BM)]
        assert [(h, sm) for h, sm, _, _ in pairs] == want
        assert all(row == start + sm and col == h * D for h, sm, row, col in pairs)


def test_cpu_default_runs_the_int32_fused_kernel_and_meets_the_reference():
    """On the CPU (and wherever attention_bwd_gluon.applies is false) "gluon" runs the int32 fused Triton kernel:
    the same bits as config dq int32, as accurate as tik_v17's default, repeatable."""
    lens = [17, 70, 45]
    a17, a18 = _att(V17), _att(V18)
    q, k, v, do = _inputs(lens, seed=3)
    cu, n, scale = _cu(lens), max(lens), 32 ** -0.5
    o, lse = a18.prefill(q, k, v, cu, n, scale, return_lse=True)
    ref = _reference(q, k, v, do, lens, scale)
    got = a18.prefill_backward(do, q, k, v, o, lse, cu, n, scale)
    i32 = a18.prefill_backward(do, q, k, v, o, lse, cu, n, scale, config={"dq": "int32"})
    base = a17.prefill_backward(do, q, k, v, o, lse, cu, n, scale)
    for name, gt, b, i, r in zip(("dq", "dk", "dv"), got, base, i32, ref):
        assert torch.equal(gt.view(torch.int16), i.view(torch.int16)), name
        assert _rel(gt, r) <= 1.02 * _rel(b, r) + 1e-4, (name, _rel(gt, r), _rel(b, r))
    again = a18.prefill_backward(do, q, k, v, o, lse, cu, n, scale)
    assert all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(got, again))


def test_gluon_kernel_does_not_apply_off_sm90():
    g = loader.load_implementation(str(V18)).module("attention_bwd_gluon")
    q, k, v, do = _inputs([8], hq=4, hkv=2, d=128)
    assert not g.applies(q, k, v, do)


def test_bad_backward_config_is_refused():
    a18 = _att(V18)
    lens = [5]
    q, k, v, do = _inputs(lens)
    o, lse = a18.prefill(q, k, v, _cu(lens), 5, 32 ** -0.5, return_lse=True)
    with pytest.raises(ValueError, match="dq must be 'gluon', 'int64', 'int32' or 'split'"):
        a18.prefill_backward(do, q, k, v, o, lse, _cu(lens), 5, 32 ** -0.5, config={"dq": "fp32"})

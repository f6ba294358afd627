"""kernels/tik_v19: tik_v18 with its Gluon attention backward warp-specialized (two consumer warpgroups, a producer
warp for the loads and the dQ reduce-adds, per-warpgroup barriers and one cross-warpgroup wait a tile pair).

Gluon has no CPU interpreter, so here: the folder is tik_v18 with attention_bwd_gluon.py alone changed; the kernel
compiles for sm_90 with TMA loads, wgmma (two consumers' worth)
and the TMA reduce-add; on the CPU the backward runs the int32 fused Triton kernel, as tik_v18's does. Its gradients
and times on the GPU: ``bash benchmarks/gpu_bwd_gluon.sh --impl tik_v19``."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.search import edits as E
from tests.helpers.scripts import ptxas_available, run_script
from tests.kernels.test_tik_v17 import _cu, _inputs

ROOT = pathlib.Path(__file__).resolve().parents[2]
V18, V19 = ROOT / "kernels" / "tik_v18", ROOT / "kernels" / "tik_v19"


def test_tik_v19_changes_only_the_gluon_backward():
    a, b = E.read_files(str(V18)), E.read_files(str(V19))
    assert sorted(r for r in b if r.endswith(".py")) == sorted(r for r in a if r.endswith(".py"))
    assert [r for r in b if r.endswith(".py") and b[r] != a[r]] == ["attention_bwd_gluon.py"]
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
    out = tmp_path / "b.json"
    r = run_script("compile_attention_bwd_gluon_sm90", "--impl", str(V19), "--json", str(out), "--quick",
                   "--max-spill", "256", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (v,) = json.loads(out.read_text())["variants"]
    assert v["tma_load"] and v["tma_reduce"] and not v["serialized_wgmma"], v
    # each consumer: S and dP (8 k-steps over D), dV and dK (4 over the query rows), dQ (8 over the 128 keys)
    assert v["wgmma"] == 2 * (8 + 8 + 4 + 4 + 8), v
    assert v["smem"] <= 227 * 1024 and v["spill_bytes"] <= 256, v


def test_cpu_backward_is_tik_v18s():
    lens = [17, 70, 45]
    a18, a19 = (loader.load_implementation(str(p)).module("attention") for p in (V18, V19))
    q, k, v, do = _inputs(lens, seed=4)
    cu, n, scale = _cu(lens), max(lens), 32 ** -0.5
    o, lse = a19.prefill(q, k, v, cu, n, scale, return_lse=True)
    for x, y in zip(a19.prefill_backward(do, q, k, v, o, lse, cu, n, scale),
                    a18.prefill_backward(do, q, k, v, o, lse, cu, n, scale)):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))

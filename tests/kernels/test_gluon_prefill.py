"""kernels/tik_v4, tik_v5 and tik_v6: tik_v2 with the sm_90 packed prefill in Gluon (attention_gluon.py, explicit
async wgmma; tik_v5 with FA3's issue order and the coupled 128-key tile admitted for benchmarks; tik_v6 with the
warp-specialized program over work items: persistent, ping-pong between its consumers).
Gluon has no CPU interpreter, so here: the Gluon kernel compiles for sm_90 with no spills for every head
dim / dtype / LSE variant ``applies`` admits and for the knob sets the H200 probes sweep; on the CPU both
run tik_v2's kernel and give its bits. Their bits on the H200: benchmarks/probes/gluon_prefill_probe.py
and the contract suite."""

from __future__ import annotations

import json
import os

import pytest
import torch

from areal_tik_plugin.runtime import loader
from tests.helpers.scripts import ptxas_available, run_script

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "kernels")


@pytest.fixture(scope="module", params=["tik_v4", "tik_v5", "tik_v6"])
def mods(request):
    imp = loader.load_implementation(os.path.join(ROOT, request.param))
    return imp.module("attention"), imp.module("attention_gluon"), \
        loader.load_implementation(os.path.join(ROOT, "tik_v2")).module("attention")


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_tik_v4_gluon_prefill_compiles_for_sm90(tmp_path):
    out = tmp_path / "g.json"
    r = run_script("compile_gluon_sm90", "--impl", os.path.join(ROOT, "tik_v4"), "--json", str(out),
                   "--configs", "ws=1,k_stages=4;warps=8,k_stages=3,v_stages=3;order=1", timeout=600)
    # the one failure is the FA3 order: ptxas serializes its wgmma (C7514: P(t)'s registers are rewritten
    # while P(t) V(t) reads them), and the script says so instead of reporting an overlap that does not happen
    assert r.returncode == 1 and r.stdout.count("FAIL") == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "ptxas serialized the wgmma (C7514)" in r.stdout
    v = json.loads(out.read_text())["variants"]
    assert {(x["d"], x["dtype"], x["lse"]) for x in v[:8]} == {(d, t, l) for d in (64, 128)
                                                               for t in ("bfloat16", "float16") for l in (False, True)}
    assert [(x["config"]["ws"], x["config"]["warps"], x["config"]["order"]) for x in v[8:]] == [(1, 4, 0), (0, 8, 0),
                                                                                               (0, 4, 1)]
    assert v[10]["serialized_wgmma"] and v[10]["wgmma_wait_1"] >= 1
    ok = v[:10]
    assert all(x["spill_bytes"] == 0 and x["fma_f32"] == 0 and x["tma"] and x["wgmma"] and not x["serialized_wgmma"]
               for x in ok), ok
    # the warp-specialized program: 3 warp groups whose registers after setmaxnreg fit the SM
    ws = v[8]
    assert ws["warps"] == 12 and 128 * (max(ws["setmaxnreg_inc"]) + sum(ws["worker_regs"])) <= 65536, ws


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_tik_v5_fa3_order_and_wide_tile_compile_for_sm90(tmp_path):
    out = tmp_path / "g.json"
    r = run_script("compile_gluon_sm90", "--impl", os.path.join(ROOT, "tik_v5"), "--json", str(out),
                   "--configs", "ws=0;ws=0,order=0;ws=0,v_stages=3;ws=0,warps=8,rev=0;ws=0,order=0,tile=128;"
                   "ws=0,warps=8,k_stages=2,order=0,tile=128;ws=0,tile=128;ws=1,order=0", timeout=600)
    # the one failure is FA3's order at the 128-key tile: two score tiles, P and the accumulators do not fit
    # 255 registers, and the script says it spills
    assert r.returncode == 1 and r.stdout.count("FAIL") == 1 and "t128 w4 k3 v2 o1 ws0 r1" in r.stdout, \
        r.stdout[-2000:] + r.stderr[-2000:]
    v = json.loads(out.read_text())["variants"]
    c = [(x["tile"], x["config"]["warps"], x["config"]["order"], x["config"]["v_stages"], x["config"]["ws"])
         for x in v[7:]]
    # the defaults (v[:8]) are the warp-specialized program in FA3's order
    assert c == [(64, 4, 1, 2, 1), (64, 4, 1, 2, 0), (64, 4, 0, 2, 0), (64, 4, 1, 3, 0), (64, 8, 1, 2, 0),
                 (128, 4, 0, 2, 0), (128, 8, 0, 2, 0), (128, 4, 1, 2, 0), (64, 4, 0, 2, 1)]
    assert v[14]["spill_bytes"] > 0
    ok = v[:14] + v[15:]
    assert all(x["spill_bytes"] == 0 and x["fma_f32"] == 0 and x["tma"] and x["wgmma"] and not x["serialized_wgmma"]
               for x in ok), ok
    # FA3's order keeps P(t) V(t) in flight under the next softmax (wgmma.wait_group 1; in both consumers
    # of the warp-specialized program) and ptxas does not serialize it; Triton's order waits for every MMA
    assert all(x["wgmma_wait_1"] >= 2 for x in v[:8]) and all(x["wgmma_wait_1"] >= 1 for x in [v[8]] + v[10:12])
    assert all(x["wgmma_wait_1"] == 0 for x in [v[9]] + v[12:14] + [v[15]])
    # programs per SM (the SM's 228 KiB, 1 KiB reserved per program; 64K registers): two with a 2-deep V
    # ring at the 64-key tile, one with a 3-deep ring (D 128) or at 128
    def fits_two(x):
        return 2 * 128 * x["regs"] <= 65536 and 2 * (x["smem"] + 1024) <= 233472
    assert fits_two(v[8]) and fits_two(v[9]) and not fits_two(v[10]) and not fits_two(v[12])
    assert v[13]["smem"] + 1024 <= 233472
    # the warp-specialized programs: 3 warp groups whose registers after setmaxnreg fit the SM, more for
    # FA3's consumers
    for ws in v[:8] + [v[15]]:
        assert ws["warps"] == 12 and 128 * (max(ws["setmaxnreg_inc"]) + sum(ws["worker_regs"])) <= 65536, ws
    assert v[7]["worker_regs"][0] > v[15]["worker_regs"][0]


def test_cpu_runs_tik_v2_kernel_with_its_bits(mods):
    a4, g4, a2 = mods
    torch.manual_seed(0)
    lens = [1, 17, 70, 33]
    T = sum(lens)
    cu = torch.tensor([0, 1, 18, 88, 121], dtype=torch.int32)
    q = torch.randn(T, 4, 64, dtype=torch.bfloat16)
    k = torch.randn(T, 2, 64, dtype=torch.bfloat16)
    v = torch.randn(T, 2, 64, dtype=torch.bfloat16)
    assert not g4.applies(q, k, v, 64, 512)
    o4, l4 = a4.prefill(q, k, v, cu, max(lens), 0.125, return_lse=True)
    o2, l2 = a2.prefill(q, k, v, cu, max(lens), 0.125, return_lse=True)
    assert torch.equal(o4.view(torch.int16), o2.view(torch.int16))
    assert torch.equal(l4.view(torch.int32), l2.view(torch.int32))


def test_gluon_knobs_are_checked(mods):
    g = mods[1]
    assert {k: g.config()[k] for k in ("warps", "k_stages", "v_stages")} == {"warps": 4, "k_stages": 3, "v_stages": 2}
    assert g.block_m(g.config(ws=1, warps=8)) == 64
    assert g.block_m(g.config(ws=0, warps=8)) == 128
    with pytest.raises(ValueError, match="unknown knob"):
        g.config(stages=3)
    with pytest.raises(ValueError, match=r"warps=6; expected one of \(4, 8\)"):
        g.config(warps=6)


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_tik_v6_work_item_program_compiles_for_sm90(tmp_path):
    out = tmp_path / "g.json"
    r = run_script("compile_gluon_sm90", "--impl", os.path.join(ROOT, "tik_v6"), "--json", str(out),
                   "--configs", "persist=1;pp=0;k_stages=2", timeout=600)
    assert r.returncode == 0 and "0 failure(s)" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    v = json.loads(out.read_text())["variants"]
    # the defaults take items from a counter (persist 2); persist 1 deals them in rounds (persist 0 compiles
    # the same code as 1, on a grid of one program per item)
    assert [(x["config"]["ws"], x["config"]["persist"], x["config"]["pp"], x["config"]["k_stages"]) for x in v] == \
        [(1, 2, 1, 3)] * 8 + [(1, 1, 1, 3), (1, 2, 0, 3), (1, 2, 1, 2)]
    for x in v:
        # no spill, contraction off, TMA + wgmma, FA3's order in both consumers (an MMA left in flight), and
        # 3 warp groups whose registers after setmaxnreg fit the SM
        assert x["spill_bytes"] == 0 and x["fma_f32"] == 0 and x["tma"] and x["wgmma"] and not x["serialized_wgmma"], x
        assert x["wgmma_wait_1"] >= 2, x
        assert x["warps"] == 12 and 128 * (max(x["setmaxnreg_inc"]) + sum(x["worker_regs"])) <= 65536, x
        assert x["smem"] + 1024 <= 233472, x


def _v6():
    return loader.load_implementation(os.path.join(ROOT, "tik_v6")).module("attention_gluon")


@pytest.mark.parametrize("B,Hq,Hkv,L,persist", [(4, 32, 8, 8192, 1), (16, 32, 8, 1024, 1), (1, 12, 2, 4096, 1),
                                                (3, 8, 2, 1000, 1), (64, 32, 4, 300, 1), (2, 32, 8, 129, 0),
                                                (1, 2, 1, 1, 1)])
def test_tik_v6_work_items_cover_every_block_once(B, Hq, Hkv, L, persist):
    """The kernel's own scheduling functions (plain integer arithmetic, run as Python here): over every
    program's rounds, each (query block, sequence, head pair) is one item exactly once; inside a section
    the longest causal blocks come first; sections keep their K / V within half of L2."""
    g = _v6()
    sms, l2 = 132, 50 * 2 ** 20
    s = g.ws_schedule(B, Hq, Hkv, L, 128, 2, sms, l2, persist)
    W, G, SEC, NMB, HP, P = (s[k] for k in ("W", "G", "SEC", "NMB", "HP", "P"))
    assert (W, G, NMB, HP) == (-(-L // 64) * B * Hq // 2, B * Hq // 2, -(-L // 64), Hq // 2)
    assert P == (min(W, sms) if persist else W)
    assert SEC >= 1 and (SEC == G or SEC * (L * 128 * 2 * 2) // max(1, Hq // Hkv // 2) <= l2 // 2)
    seen, load = {}, [0] * P
    for p in range(P):   # as the kernel's partitions walk them: rounds until the first index >= W
        k, w = 0, g._wsp_work.fn(0, P, p)
        while w < W:
            item = g._wsp_item.fn(w, G, SEC, NMB, HP, True)
            assert item not in seen, (item, w, seen.get(item))
            seen[item] = w
            load[p] += item[0] + 1
            k += 1
            w = g._wsp_work.fn(k, P, p)
        assert k <= -(-W // P)
    assert sorted(seen) == [(mb, b, hp) for mb in range(NMB) for b in range(B) for hp in range(HP)]
    for (mb, b, hp), w in seen.items():
        sec = w // (SEC * NMB)
        assert sec == (b * HP + hp) // SEC   # a group stays in its section
    by_w = [item for item, _ in sorted(seen.items(), key=lambda x: x[1])]
    for sec in range(-(-G // SEC)):   # inside a section: query blocks last-first
        blocks = [mb for (mb, b, hp) in by_w if (b * HP + hp) // SEC == sec]
        assert blocks == sorted(blocks, reverse=True)
    if persist and W >= 30 * P:   # many items per program: snake dealing keeps the programs' work within 5 %
        assert max(load) <= 1.05 * sum(load) / P, max(load) * P / sum(load)


def test_tik_v6_knobs_are_checked():
    g = _v6()
    c = g.config()
    assert (c["ws"], c["persist"], c["pp"], c["order"], c["k_stages"]) == (1, 2, 1, 1, 3)
    s = g.ws_schedule(1, 32, 8, 8192, 128, 2, 132, 50 * 2 ** 20, 2)
    assert (s["W"], s["P"]) == (2048, 132)
    assert g.config(ws=0, order=0, k_stages=1)["ws"] == 0
    with pytest.raises(ValueError, match=r"ws=1 runs FA3's order .*got order=0, k_stages=3"):
        g.config(order=0)
    with pytest.raises(ValueError, match=r"expected order=1 and k_stages >= 2, got order=1, k_stages=1"):
        g.config(k_stages=1)
    with pytest.raises(ValueError, match=r"pp=2; expected one of \(0, 1\)"):
        g.config(pp=2)
    with pytest.raises(ValueError, match=r"pp=\[1\]; expected one of \(0, 1\)"):
        g.config(pp=[1])
    # the defaults are read per call: a knob set on the module (a search move) takes effect
    c["pp"] = 0   # and a caller's copy never reaches the next call
    assert g.config()["pp"] == 1
    old = g.PP
    try:
        g.PP = 0
        assert g.config()["pp"] == 0
    finally:
        g.PP = old
    assert g.config()["pp"] == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads, D, rows", [(5, 128, 37), (3, 64, 1)])
def test_tik_v6_descriptor_equals_tritons_checked_one(dtype, heads, D, rows):
    """The descriptor built without the dataclass's checks holds what the checked constructor holds."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    g = _v6()
    x = torch.empty(rows, heads, D, dtype=dtype)
    for block in ((64, D), (128, D)):
        ours = g._descriptor(x, heads, D, block)
        ref = TensorDescriptor(x, [rows, heads * D], [x.stride(0), 1], list(block), g._smem_layout(block, dtype))
        assert type(ours) is TensorDescriptor and ours == ref
        assert ours.layout == g.gl.NVMMASharedLayout.get_default_for(
            list(block), g.gl.bfloat16 if dtype == torch.bfloat16 else g.gl.float16)

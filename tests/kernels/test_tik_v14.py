"""kernels/tik_v14: tik_v13 with a stream form for the Gluon GEMM (gemm_gluon.py, ``stream`` 1): where whole tiles
leave the last wave of the SMs part-filled (at M 256 the 96 128 x 128 tiles of Qwen3-4B qkv fill 96 of 132 SMs; at
M 1024 Qwen3-4B down's 160 tiles take two waves for 1.2 waves of work), the last one or two waves of tiles are cut
into per-program ranges of GEMM_BLOCK_K steps. A tile cut between two programs is one wgmma chain all the same: the
first program runs its first steps first of all and stores the chain's state (the finished chunks' sum and the
running chunk's partial, fp32, exact), the next program loads it as the accumulator and runs the remaining steps
last -- the instructions and the order of the whole-tile form, so the same bits, and nobody waits on work queued
behind its own.

Gluon has no CPU interpreter: the CPU checks the schedule (the kernel's integer functions, run as Python) -- every
step of every tile once, in increasing order, head before tail, the handoff slots matched; the plan rule (stream
only where the waves leave SMs idle and every range spans a tile; off unless STREAM_TILES or a configuration sets
it, so config_for is tik_v13's); and the sm_90 compile of every stream variant without spills or serialized wgmma.

On an H100 (evidence/probes/gemm/gluon_gemm_probe-tik_v14.json, this device code with the form on by default) every
stream plan kept tik_v13's bits (Qwen3-4B qkv / down, 8B gate_up, 30B-A3B qkv at M 256 and 1024, and the guard's
problems) and none hung, but on no shape was its best plan faster than the best whole-tile plan: Qwen3-8B gate_up at
M 1024 429.5 us against 308.4 (gluon_gemm_probe-large-tik_v12.json), Qwen3-4B qkv 66.3 against 59.0. Not
selected; the form stays a knob for the probe and the search."""

from __future__ import annotations

import itertools
import json
import pathlib

import pytest

from areal_tik_plugin.runtime import loader
from tests.helpers.folders import assert_child
from tests.helpers.native_build import needs_triton36
from tests.helpers.scripts import ptxas_available, run_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
V13, V14 = ROOT / "kernels" / "tik_v13", ROOT / "kernels" / "tik_v14"


@pytest.fixture(scope="module")
def g14():
    return loader.load_implementation(str(V14)).module("gemm_gluon")


def test_tik_v14_changes_the_gluon_gemm_and_its_config_names():
    assert_child(V13, V14, ["gemm.py", "gemm_gluon.py"])


@needs_triton36
def test_config_for_is_tik_v13s_while_the_stream_form_is_off():
    g13 = loader.load_implementation(str(V13)).module("gemm")
    g14 = loader.load_implementation(str(V14)).module("gemm")
    assert g14._gluon().STREAM_TILES is False
    for M in (1, 33, 64, 65, 128, 200, 256, 300, 512, 1024, 4096):
        for N, K in ((6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728), (4096, 12288), (1536, 8960),
                     (2048, 4096), (5121, 2049)):
            c13, c14 = g13.config_for(M, N, K, 132), g14.config_for(M, N, K, 132)
            if "gluon" in c13:
                c13 = dict(c13, gluon=dict(c13["gluon"], stream=0))
            assert c14 == c13, (M, N, K)


def schedule(g, progs, n_dp, n_sk, S):
    """Per program, the (tile, s0, s1) pieces in run order, from the kernel's own functions."""
    out = []
    for p in range(progs):
        n = g._stream_count.fn(p, progs, n_dp, n_sk, S)
        out.append([g._stream_piece.fn(i, p, progs, n_dp, n_sk, S) for i in range(n)])
    return out


@pytest.mark.parametrize("tiles,progs,S", [(133, 132, 40), (160, 132, 5), (192, 132, 40), (640, 132, 152),
                                           (1536, 132, 64), (264, 132, 7), (265, 132, 1), (7, 5, 3), (11, 4, 9),
                                           (96, 132, 40), (264, 132, 40)])
def test_stream_schedule_covers_every_step_once_in_order(g14, tiles, progs, S):
    n_dp, n_sk = g14.stream_split(tiles, progs)
    assert n_dp + n_sk == tiles
    assert n_sk == 0 if tiles <= progs or tiles % progs == 0 else (progs <= n_sk < 2 * progs and n_dp % progs == 0)
    sched = schedule(g14, progs, n_dp, n_sk, S)
    steps = {}
    for p, pieces in enumerate(sched):
        for i, (t, s0, s1) in enumerate(pieces):
            assert 0 <= t < tiles and 0 <= s0 < s1 <= S, (p, i, t, s0, s1)
            steps.setdefault(t, []).append((s0, s1, p, i, len(pieces)))
    assert sorted(steps) == list(range(tiles))
    for t, pcs in steps.items():
        pcs.sort()
        assert pcs[0][0] == 0 and pcs[-1][1] == S and all(a[1] == b[0] for a, b in zip(pcs, pcs[1:])), (t, pcs)
        assert len(pcs) <= 2, (t, pcs)                     # a tile spans at most two programs
        if len(pcs) == 2:
            (_, _, p0, i0, _), (_, _, p1, i1, n1) = pcs
            # the head is its program's first item and hands off to the next program, whose last item the tail is
            assert p1 == p0 + 1 and i0 == 0 and i1 == n1 - 1, (t, pcs)
        if t < n_dp:
            assert len(pcs) == 1 and pcs[0][2] == t % progs   # whole tiles dealt in rounds
    # balance: every program's step count within one tile of the mean
    work = [sum(s1 - s0 for _, s0, s1 in pcs) for pcs in sched]
    assert max(work) - min(work) <= (S if n_sk == 0 else 1), work


@pytest.mark.parametrize("M,N,K", [(256, 6144, 2560), (256, 19456, 2560), (1024, 2560, 9728), (1024, 5120, 2048),
                                   (512, 6144, 4096), (4096, 2560, 4096), (300, 1537, 4097), (64, 2560, 4096)])
def test_plan_stream_only_where_the_waves_leave_sms_idle(g14, M, N, K, monkeypatch):
    gemm = loader.load_implementation(str(V14)).module("gemm")
    chunk = gemm.split_chunk(K)
    assert not g14.plan(M, N, K, chunk, 132)["stream"]          # off by default
    monkeypatch.setattr(g14, "STREAM_TILES", True)               # plan() reads the module knobs per call
    p = g14.plan(M, N, K, chunk, 132)
    assert p["stream"] or (M, N, K) not in {(1024, 2560, 9728), (256, 6144, 2560)}   # 160 / 192 tiles, 132 SMs
    if p["stream"]:
        assert p["split"] == 0 and p["tiles"] > 132 and p["tiles"] % 132 and p["programs"] == 132
        assert (p["items"], p["n_sk"]) == g14.stream_split(p["tiles"], 132)
    for bn, halves in itertools.product(g14.BLOCK_NS, (1, 2)):
        if bn == 256 and p["n_chunks"] > 1:
            continue
        q = g14.plan(M, N, K, chunk, 132, g14.config(BLOCK_N=bn, halves=halves, stream=1))
        # a forced stream form where the tiles fill whole waves (or less than one) is the whole-tile form
        assert q["stream"] == int(q["tiles"] > 132 and q["tiles"] % 132 != 0 and M >= 64), q
        if not q["stream"]:
            assert q["n_sk"] == 0 and q["items"] == q["tiles"]


@needs_triton36
def test_config_for_names_the_stream_form():
    gemm = loader.load_implementation(str(V14)).module("gemm")
    seen = set()
    for M in (193, 256, 300, 512):
        for N, K in ((2560, 4096), (2560, 9728), (4096, 12288), (1536, 8960), (2048, 4096)):
            c = gemm.config_for(M, N, K, 132)
            if "gluon" in c:
                form = "stream" if c["gluon"]["stream"] else ("split" if c["gluon"]["split"] else "fused")
                assert f"_{form}_" in c["name"], c
                seen.add(form)
    assert "fused" in seen


@pytest.mark.skipif(not ptxas_available(), reason="triton's bundled ptxas not found")
def test_stream_form_compiles_for_sm90(tmp_path):
    out = tmp_path / "gemm_gluon.json"
    r = run_script("compile_gemm_gluon_sm90", "--impl", str(V14), "--quick", "--json", str(out), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    stream = [v for v in json.loads(out.read_text())["variants"] if v.get("stream")]
    assert {(v["BLOCK_N"], v["chunks"], v["halves"], v.get("xbox", 64)) for v in stream} >= {
        (bn, c, h, 64) for h in (1, 2) for bn, c in ((256, 1), (128, 1), (128, 6), (64, 1))}
    for v in stream:
        assert v["spill_bytes"] == 0 and not v["serialized_wgmma"] and v["fma_f32"] == 0, v
        assert len(v["named_barriers"]) >= v["halves"], v   # each consumer's flag barrier its own

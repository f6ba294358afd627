"""`tik search` on the batch-invariant GEMM (runner ``search/runners/gemm.py``), on the CPU.

* the shipped GEMM specs validate, and every suite / case they name exists in the runner;
* the knob search end to end on a copy of the real tik_v1 kernels under the Triton interpreter
  (root audit verified + knob moves);
* the runner's bitwise suites catch non-invariant linears (split-K whose split count depends on M, or
  on the row's position), while an invariant reference passes them.
"""

from __future__ import annotations


import pytest
import torch

from areal_tik_plugin.runtime import loader
from areal_tik_plugin.contract.suite import Recorder
from areal_tik_plugin.search import edits as E, spec as S
from areal_tik_plugin.search.runners import gemm as R

QWEN_DENSE = {(6144, 2560), (2560, 4096), (19456, 2560), (2560, 9728),     # Qwen3-4B qkv, o, gate_up, down
              (6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288),    # Qwen3-8B
              (1536, 8960)}                                                # Qwen2.5-1.5B down


def test_gemm_specs_validate():
    h = S.load("h200_gemm")
    assert h["target"]["device"] == "cuda" and h["runner"] == "areal_tik_plugin.search.runners.gemm"
    assert h["max_slowdown"] == 1.05 and list(h["entry_points"]) == ["gemm.linear"]
    wl = h["workloads"]
    assert {(w["shape"]["N"], w["shape"]["K"]) for w in wl} == QWEN_DENSE
    assert {w["shape"]["M"] for w in wl} == {1, 64, 256, 1024, 4096} and len(wl) == 44
    # M = 256 (the mid-M tiles) on the Qwen3-4B / Qwen3-8B projections
    assert {(w["shape"]["N"], w["shape"]["K"]) for w in wl if w["shape"]["M"] == 256} == QWEN_DENSE - {(1536, 8960)}
    assert all(w["weight"] == 1.0 and w["root_latency_us"] is None for w in wl)
    assert all((w.get("quick", True) is False) == (w["shape"]["M"] == 4096) for w in wl)
    q = S.freeze(h, quick=True)
    assert len(q["workloads"]) == 35 and S.criteria_hash(q) != S.criteria_hash(S.freeze(h))
    assert max(m for s in h["bitwise"] if s["suite"] == "rows_vs_m1" for m in s["Ms"]) >= 16384
    c = S.load("cpu_gemm_smoke")
    assert c["target"]["device"] == "cpu" and c["runner"] == h["runner"]
    for spec in (h, c):
        assert {s["suite"] for s in spec["bitwise"]} <= set(R.BITWISE_SUITES)
        assert {"rows_vs_m1", "positions", "graph_replay"} <= {s["suite"] for s in spec["bitwise"]}
        assert {a["suite"] for a in spec["accuracy"]} == {"vs_fp64"}
        # the knobs the search will move on the real kernels: the coupled GEMM_BLOCK_K and the free tile knobs
        files = E.read_files(loader.resolve_path("tik_v1"))
        mods = E.entry_modules(loader.read_manifest(loader.resolve_path("tik_v1")), list(spec["entry_points"]))
        knobs = E.select_knobs(E.discover_knobs(files, spec["target"]["knob_key"], mods), spec)
        assert {"GEMM_BLOCK_K", "GROUP_M", "USE_TMA", "SMALL_M_WARPS", "SMALL_M_MAX_STAGES"} <= set(knobs)
        assert knobs["GEMM_BLOCK_K"].coupled and not knobs["GROUP_M"].coupled
        assert all(E.knob_scope(n, k.coupled, spec) == ["gemm.linear"] for n, k in knobs.items())


def test_gemm_knob_search_on_tik_v1_interpreter(knob_run_on_tik_v1):
    run = knob_run_on_tik_v1("cpu_gemm_smoke", 2)
    e0 = run.audits["E0000"]
    assert e0.status == "ok" and e0.verified, e0.error
    checks = {c["name"]: c for c in e0.checks}
    assert {"rows_vs_m1[80x192/M=70]", "rows_vs_m1[33x2100+bias/M=70]", "positions_scattered[80x192+bias/M=17->37]",
            "strided_x[80x192/M=9/pad=3]", "zero_rows_are_plus_zero[80x192/M=9]",
            "vs_fp64[80x192/M=33]", "vs_fp64[33x2100+bias/fp16/M=5]"} <= set(checks)
    assert all(c["passed"] for c in e0.checks)
    assert {c["kind"] for c in e0.checks} >= {"bitwise", "accuracy"}
    assert checks["graph_replay"].get("skipped")
    assert set(e0.latencies_us) == {w["name"] for w in run.spec["workloads"]}
    a1 = run.actions["A0001"]
    assert len(a1.knob_moves) == 1 and next(iter(a1.knob_moves)).startswith("GEMM_")  # a coupled knob first
    assert {e["file"] for e in a1.edits} == {"contract.py"}
    assert run.audits["E0001"].status == "ok", run.audits["E0001"].error  # one constant, every path moves
    assert run.state().t == 2 and "A0002" in run.actions


# ------------------------------------------------------------------------------------------------
# the suites must be able to fail
# ------------------------------------------------------------------------------------------------
def _split_k(x, w, b, splits):
    """fp32 partial products over ``splits`` K ranges, each rounded to the activation dtype (a split-K
    workspace in bf16), then summed: different bits than one fp32 chain for most elements."""
    acc = torch.zeros(x.shape[0], w.shape[0])
    for c in torch.tensor_split(torch.arange(x.shape[1]), splits):
        acc += (x[:, c].float() @ w[:, c].float().t()).to(x.dtype).float()
    if b is not None:
        acc += b.float()
    return acc.to(x.dtype)


def exact_linear(x, w, b=None, config=None, out=None):
    y = x.double() @ w.double().t() + (b.double() if b is not None else 0.0)
    return y.to(x.dtype)


def m_dependent_linear(x, w, b=None, config=None, out=None):
    M = x.shape[0]
    return _split_k(x, w, b, 1 + (M > 4) + (M > 20))   # a split-K heuristic: more splits for larger batches


def position_dependent_linear(x, w, b=None, config=None, out=None):
    y = _split_k(x, w, b, 1)
    y[1::2] = _split_k(x[1::2], w, b, 3)   # odd positions of the batch take another reduction order
    return y


class FakeCtx:
    device = "cpu"

    def __init__(self, fn):
        self.spec = {"model": {"dtype": "bfloat16"}}
        self.model = self.spec["model"]
        self.rec = Recorder("fake")
        self._fn = fn

    def entry(self, op):
        if op != "gemm.linear":
            raise KeyError(op)
        return self._fn


SUITES = [{"suite": "rows_vs_m1", "N": 40, "K": 96, "bias": True, "Ms": [1, 7, 33]},
          {"suite": "positions", "N": 40, "K": 96, "M": 17},
          {"suite": "strided_x", "N": 40, "K": 96, "M": 9, "pads": [8, 3]},
          {"suite": "zero_rows", "N": 40, "K": 96, "M": 9},
          {"suite": "graph_replay"}]


def _failed(fn) -> set[str]:
    ctx = FakeCtx(fn)
    for s in SUITES:
        R.bitwise_suite(ctx, s)
    assert ctx.rec.checks
    return {c["name"] for c in ctx.rec.checks if not c["passed"]}


def test_bitwise_suites_pass_an_invariant_linear():
    assert _failed(exact_linear) == set()


def test_bitwise_suites_catch_an_m_dependent_linear():
    bad = _failed(m_dependent_linear)
    assert {"rows_vs_m1[40x96+bias/M=7]", "rows_vs_m1[40x96+bias/M=33]",
            "positions_scattered[40x96/M=17->37]"} <= bad
    assert "rows_vs_m1[40x96+bias/M=1]" not in bad


def test_bitwise_suites_catch_a_position_dependent_linear():
    bad = _failed(position_dependent_linear)
    # M=17 reversed keeps every row's parity, so only the scattered placement sees it
    assert "positions_scattered[40x96/M=17->37]" in bad and "positions_reversed[40x96/M=17]" not in bad
    assert "rows_vs_m1[40x96+bias/M=33]" in bad


def test_runner_rejects_unknown_names():
    ctx = FakeCtx(exact_linear)
    with pytest.raises(ValueError, match="rows_vs_m1"):
        R.bitwise_suite(ctx, {"suite": "prefix_decode"})
    with pytest.raises(ValueError, match="vs_fp64"):
        R.accuracy_case(ctx, {"suite": "varlen_vs_fp32", "atol": 1, "rtol": 1})
    with pytest.raises(ValueError, match="gemm.linear"):
        R.workload(ctx, {"name": "w", "entry": "attention.prefill", "shape": {"M": 1, "N": 8, "K": 8}})
    with pytest.raises(ValueError, match=r"Ms"):
        R.bitwise_suite(ctx, {"suite": "rows_vs_m1", "N": 8, "K": 8})
    fn = R.workload(ctx, {"name": "w", "entry": "gemm.linear", "shape": {"M": 3, "N": 8, "K": 16, "bias": True}})
    assert fn().shape == (3, 8)

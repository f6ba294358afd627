"""The contract suite's backward check on CPU (Triton interpreter, tiny odd shapes): it passes the shipped
backward and fails one whose gradients are accurate but not the same bits on a repeat of the same call."""

import pytest
import torch

from areal_tik_plugin.contract import attention as A
from areal_tik_plugin.contract.suite import Recorder
from areal_tik_plugin.runtime import loader

SMALL = dict(lens=(5, 17), heads=(4, 2, 16), repeats=2)


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(A, "DEV", "cpu")


def _failed(rec):
    return sorted(c["name"] for c in rec.checks if not c["passed"])


def test_backward_check_passes_the_shipped_backward(on_cpu):
    rec = Recorder("attention")
    A._check_backward(rec, **SMALL)
    names = [c["name"] for c in rec.checks]
    assert _failed(rec) == [] and rec.errors == []
    # accuracy of dq / dk / dv and every repeat's bits, per dtype
    assert len(names) == 2 * (3 + 3 * SMALL["repeats"])
    assert "grad_repeat_dk[4/2/d16/T22/float16/2]" in names


def test_backward_check_refuses_gradients_that_change_between_repeats(on_cpu, monkeypatch):
    mod = loader.current_module("attention")
    real = mod.prefill_backward

    calls = []

    def drifting(*args):  # within the tolerance table, but a different rounding on each call (as fp32 atomics)
        dq, dk, dv = real(*args)
        calls.append(1)
        return (dq.float() * (1 + 1e-3 * (len(calls) % 3))).to(dq.dtype), dk, dv

    monkeypatch.setattr(mod, "prefill_backward", drifting)
    rec = Recorder("attention")
    A._check_backward(rec, **SMALL)
    failed = _failed(rec)
    assert failed and all(n.startswith("grad_repeat_dq[") for n in failed), failed
    assert not any(n.startswith("grad_dq") for n in failed)

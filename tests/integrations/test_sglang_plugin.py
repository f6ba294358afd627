"""SGLang plugin plumbing (no Engine): entry point, registration, hooks inactive until the
``tik`` backend is built, per-request seeds, the sampler's log-prob op, the launcher's spawn targets."""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys

import pytest
import torch

if importlib.util.find_spec("sglang") is None:
    if os.environ.get("CI"):
        raise RuntimeError("sglang is not installed: .ci/install_sglang.sh should have installed it")
    pytest.skip("sglang not installed (run .ci/install_sglang.sh VENV)", allow_module_level=True)

from areal_tik_plugin.integrations.sglang import check as SC  # noqa: E402
from areal_tik_plugin.integrations.sglang import layers as L  # noqa: E402

# Checks that import SGLang run in a child process: importing SGLang patches transformers / torch
# state, which must not leak into the other test modules of the same pytest session.
_IN_CHILD = r"""
import importlib.metadata, sys
from areal_tik_plugin.integrations.sglang import launch as sglang_launch, plugin as sglang_plugin
from areal_tik_plugin.integrations.sglang import layers as L
from areal_tik_plugin.integrations.sglang.backend import create_tik_backend

eps = [e for e in importlib.metadata.entry_points(group="sglang.srt.plugins") if e.name == "tik"]
assert eps and eps[0].value == "areal_tik_plugin.integrations.sglang.plugin:load", eps
assert eps[0].load() is sglang_plugin.load

sglang_plugin.register(apply_now=True)
sglang_plugin.register(apply_now=True)  # idempotent
from sglang.srt.arg_groups import choices as C
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
assert ATTENTION_BACKENDS["tik"] is create_tik_backend
for lst in (C.ATTENTION_BACKEND_CHOICES, C.DETERMINISTIC_ATTENTION_BACKEND_CHOICES,
            C.RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND):
    assert lst.count("tik") == 1, lst

# hooks installed, inactive until the tik backend is built
from sglang.kernels.spec import KernelBackend
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.sampler import Sampler
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
assert not L.is_active()
assert getattr(Sampler.forward, "__wrapped__", None) is not None
assert getattr(UnquantizedLinearMethod.apply, "__wrapped__", None) is not None
# SGLang's CUDA dual GEMM (fused gate_up + SiLU) is turned off under tik, left alone otherwise
from sglang.srt.layers.dual_gemm import DualGemm
assert getattr(DualGemm._select_mode, "__wrapped__", None) is not None
assert L.dual_gemm_select_hook(lambda self, *a: "stock", None, None, 16) == "stock"
L._STATE["active"] = True
assert L.dual_gemm_select_hook(lambda self, *a: "stock", None, None, 16) is None
assert L.COUNTS["dual_gemm_off"] == 1
L._STATE["active"] = False
assert RMSNorm.forward_plugin.__name__ == "forward_plugin"  # traced as "plugin"
assert KernelBackend.PLUGIN not in RMSNorm.capabilities  # declared only on activation

# launcher: SGLang's spawn targets become this package's module-level wrappers
from sglang.srt.entrypoints.engine import Engine
from sglang.srt.managers import scheduler
keep = {"orig": scheduler.run_scheduler_process}  # not a module global: install() rebinds those
sglang_launch.install()
assert scheduler.run_scheduler_process is sglang_launch.run_scheduler_process
assert Engine.run_scheduler_process_func is sglang_launch.run_scheduler_process
assert sglang_launch._ORIG["scheduler"] is keep["orig"]
print("CHILD-OK")
"""


def test_registration_hooks_and_launcher_in_child():
    import subprocess

    r = subprocess.run([sys.executable, "-c", _IN_CHILD], env=SC.child_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "CHILD-OK" in r.stdout, (r.stdout[-3000:], r.stderr[-3000:])


def test_request_seeds_distinct_and_stable():
    seeds = [L.request_seed(f"rid-{i}") for i in range(64)]
    assert len(set(seeds)) == 64
    assert seeds[3] == L.request_seed("rid-3")
    assert all(0 <= s < 2 ** 62 for s in seeds)


def test_sampler_logprob_rows_bitwise_equal_trainer_float_temperature():
    """The sampler passes per-row fp32 temperatures; the trainer a float: same bits per row."""
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(5, 301, generator=g) * 3).to(torch.bfloat16).float()
    toks = torch.randint(0, 301, (5,), generator=g)
    temps = torch.tensor([1.0, 0.7, 1.0, 1.3, 0.7], dtype=torch.float32)
    rows = L.token_logprobs_rows(logits, toks, temps)
    from areal_tik_plugin import ops

    for i in range(5):
        one = ops.token_logprobs(logits[i:i + 1].to(torch.bfloat16), toks[i:i + 1], temperature=float(temps[i]))
        assert torch.equal(rows[i:i + 1].view(torch.int32), one.view(torch.int32))


def test_inv_freq_matches_hf_default():
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    cfg = Qwen3Config(hidden_size=128, num_attention_heads=4, head_dim=32,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    hf = Qwen3RotaryEmbedding(cfg).inv_freq
    ours = L.hf_default_inv_freq(10000.0, 32)
    assert ours.dtype == torch.float32 and torch.equal(ours.view(torch.int32), hf.view(torch.int32))


def test_launcher_spawn_targets_pickle_by_module_name():
    from areal_tik_plugin.integrations.sglang import launch as sglang_launch

    for fn in (sglang_launch.run_scheduler_process, sglang_launch.run_data_parallel_controller_process):
        data = pickle.dumps(fn)
        assert b"areal_tik_plugin.integrations.sglang.launch" in data
        assert pickle.loads(data) is fn


def test_summarize_flags_missing_and_foreign_paths():
    stats = [{"active": True, "counts": {k: 1 for k in SC.DENSE_OPS},
              "fused_op_trace": {"RMSNorm|plugin": 3, "SiluAndMul|torch": 1}}]
    s = SC.summarize(stats, moe=False)
    assert not s["missing"] and s["other_paths"] == {"SiluAndMul|torch": 1} and not s["ok"]
    s = SC.summarize(stats, moe=True)
    assert s["missing"] == ["moe_route", "moe_experts"]


_GPU_STUBS_CHILD = r"""
import importlib, sys
import sgl_kernel
assert sgl_kernel.__file__.endswith("devenv/gpu_stubs/sgl_kernel/__init__.py"), sgl_kernel.__file__
from sgl_kernel.utils import is_arch_support_pdl
assert is_arch_support_pdl() is False
from sgl_kernel import weak_ref_tensor, silu_and_mul
assert weak_ref_tensor(sys) is sys
try:
    silu_and_mul(1, 2)
except RuntimeError as e:
    assert "sgl_kernel.silu_and_mul was called" in str(e), e
else:
    raise AssertionError("a stubbed sgl_kernel function must raise")
try:
    importlib.import_module("sgl_kernel.scalar_type")  # SGLang's own ImportError fallback must run
except ImportError:
    pass
else:
    raise AssertionError("unlisted sgl_kernel submodules must be absent")
import sitecustomize
assert sitecustomize.__file__.endswith("devenv/gpu_stubs/sitecustomize.py"), sitecustomize.__file__
print("STUBS-OK")
"""


def test_gpu_stubs_raise_or_are_absent_never_silent():
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SC.gpu_stub_path(), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", _GPU_STUBS_CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert "STUBS-OK" in r.stdout, r.stdout + r.stderr


def test_training_logprobs_micro_batches_are_bitwise_equal(tmp_path):
    from tests.helpers.sglang_models import build_model

    path = str(tmp_path / "m")
    build_model(path, "qwen3")
    reqs = [([5, 6, 7, 8, 9], [10, 11, 12], 1.0), ([5, 6, 7], [13, 14], 0.7), ([5, 6, 7, 8], [15, 16, 17, 18], 1.2)]
    one = SC.training_logprobs(path, reqs)
    split = SC.training_logprobs(path, reqs, max_tokens_per_forward=8)  # three forwards
    assert [len(x) for x in one] == [3, 2, 4]
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(one, split))
    with pytest.raises(ValueError, match="max_tokens_per_forward"):
        SC.training_logprobs(path, reqs, max_tokens_per_forward=0)


def test_qk_norm_hook_one_launch_on_adjacent_views_same_bits(monkeypatch):
    """SGLang's q, k = qkv.split(...): the hook norms both in one launch (ops.qk_rms_norm, read in
    place) with the bits of two ops.rms_norm calls; q, k that are not adjacent take the two calls."""
    import types

    from areal_tik_plugin import ops

    monkeypatch.setitem(L._STATE, "active", True)
    T, hq, hkv, D = 7, 4, 2, 64
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(T, (hq + 2 * hkv) * D, generator=g).to(torch.bfloat16)
    q, k, _ = qkv.split([hq * D, hkv * D, hkv * D], dim=-1)
    norm = lambda seed: types.SimpleNamespace(  # noqa: E731
        weight=(1 + 0.2 * torch.randn(D, generator=torch.Generator().manual_seed(seed))).to(torch.bfloat16),
        variance_epsilon=1e-6)
    qn, kn = norm(1), norm(2)
    rq = ops.rms_norm(q.reshape(-1, D).contiguous(), qn.weight, 1e-6).view(q.shape)
    rk = ops.rms_norm(k.reshape(-1, D).contiguous(), kn.weight, 1e-6).view(k.shape)
    before = dict(L.COUNTS)
    oq, ok = L.qk_norm_hook(None, q, k, qn, kn, D)
    assert L.COUNTS["qk_rms_norm"] == before.get("qk_rms_norm", 0) + 1
    assert oq.shape == q.shape and ok.shape == k.shape
    assert torch.equal(oq.view(torch.int16), rq.view(torch.int16))
    assert torch.equal(ok.view(torch.int16), rk.view(torch.int16))
    oq2, ok2 = L.qk_norm_hook(None, q.contiguous(), k.contiguous(), qn, kn, D)  # separate buffers
    assert L.COUNTS["rms_norm"] == before.get("rms_norm", 0) + 2
    assert torch.equal(oq2.view(torch.int16), rq.view(torch.int16))
    assert torch.equal(ok2.view(torch.int16), rk.view(torch.int16))


_FUSED_KV_CHILD = r"""
import types
import torch
from sglang.kernels.ops.attention.rope import FusedSetKVBufferArg
from areal_tik_plugin.integrations.sglang import layers as L

T, hq, hkv, D, slots = 5, 4, 2, 64, 16
g = torch.Generator().manual_seed(5)
qkv = torch.randn(T, (hq + 2 * hkv) * D, generator=g).to(torch.bfloat16)
q, k, v = qkv.split([hq * D, hkv * D, hkv * D], dim=-1)   # SGLang's views of one qkv buffer
rot = types.SimpleNamespace(head_size=D, _tik_inv_freq=L.hf_default_inv_freq(1e6, D))
pos = torch.tensor([3, 0, 7, 100, 4095])
loc = torch.tensor([9, 2, 11, 5, 14])
kb = torch.full((slots, hkv * D), 7.0, dtype=torch.bfloat16)
vb = torch.full_like(kb, -3.0)
b16 = lambda t: t.contiguous().view(torch.int16)
rq, rk = L.rope_forward_plugin(rot, pos, q, k)   # the plain path (the tik backend then writes the pool)
arg = FusedSetKVBufferArg(value=v, k_buffer=kb, v_buffer=vb, cache_loc=loc)
oq, ok = L.rope_forward_plugin(rot, pos, q, k, fused_set_kv_buffer_arg=arg)
assert torch.equal(b16(oq), b16(rq)) and torch.equal(b16(ok), b16(rk))
assert torch.equal(b16(kb[loc]), b16(rk.reshape(T, -1))) and torch.equal(b16(vb[loc]), b16(v))
rest = torch.ones(slots, dtype=torch.bool)
rest[loc] = False
assert (kb[rest] == 7.0).all() and (vb[rest] == -3.0).all()
assert L.COUNTS["rope_fused_kv_write"] == 1
for bad, exc, msg in ((dict(value=v), NotImplementedError, "ROCm dict layout"),
                      (FusedSetKVBufferArg(value=v, k_buffer=kb[:, :D], v_buffer=vb, cache_loc=loc), ValueError,
                       "expected \\[slots, 128\\]")):
    try:
        L.rope_forward_plugin(rot, pos, q, k, fused_set_kv_buffer_arg=bad)
        raise SystemExit(f"no error for {type(bad).__name__}")
    except exc as e:
        import re
        assert re.search(msg, str(e)), str(e)
print("FUSED-OK")
"""


def test_rope_plugin_writes_the_pool_for_sglang_fused_set_kv_buffer_arg():
    """Qwen3-MoE (and other models) on CUDA with a bf16 pool hand RoPE SGLang's FusedSetKVBufferArg and
    call attention with save_kv_cache=False: the plugin writes the rotated k and v rows at cache_loc, the
    same bits the tik backend writes on the plain path, and refuses layouts it does not know. Runs in a
    child process (SGLang's real arg class; importing SGLang patches torch)."""
    import subprocess

    r = subprocess.run([sys.executable, "-c", _FUSED_KV_CHILD], env=SC.child_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "FUSED-OK" in r.stdout, (r.stdout[-3000:], r.stderr[-3000:])

"""Pure parts of the evaluator, no process: the static source check, the A/B promotion rule under
noise, the GPU profiler's kernel classification (a recorded profile), PTX instruction counts."""

from __future__ import annotations

import random

import pytest

from areal_tik_plugin.search import sandbox as X
from areal_tik_plugin.search.state import ab_verdict, is_promotion
from areal_tik_plugin.search.worker import classify_kernels, gpu_kernel_names, ptx_counts

ROOT = "import os\nimport torch\nFAST = os.environ.get('X')\n"


@pytest.mark.parametrize("src, what", [
    ("import time\ntime.perf_counter = lambda: 0.0\n", "import of 'time'"),
    ("import torch\ntorch.cuda.Event = object\n", "foreign module 'torch'"),
    ("import torch\nev = torch.cuda\nev.Event = object\n", "foreign module 'ev'"),
    ("from torch import cuda\ncuda.synchronize = print\n", "foreign module 'cuda'"),
    ("from areal_tik_plugin.contract import suite\n", "import of 'areal_tik_plugin.contract'"),
    ("import torch\ntorch.os.system('true')\n", "attribute 'os'"),
    ("import torch\nx = torch.__dict__\n", "dunder attribute '__dict__'"),
    ("x = ().__class__.__mro__\n", "dunder attribute '__class__'"),
    ("eval('1')\n", "'eval'"),
    ("f = open('/etc/passwd')\n", "'open'"),
    ("import torch\ny = getattr(torch, 'o' + 's')\n", "getattr with a computed"),
    ("from torch.utils.cpp_extension import load_inline\n", "denied"),
    ("import importlib\n", "import of 'importlib'"),
    ("from .. import x\n", "relative import above"),
])
def test_static_check_refuses(src, what):
    found = X.check_source("k.py", src)
    assert any(what in v for v in found), found


def test_static_check_allows_kernels_and_grandfathers_the_root():
    ok = ("import math\nimport torch\nimport triton\nimport triton.language as tl\nfrom . import contract as C\n"
          "C.X = 3\nBLOCK = 4\n@triton.jit\ndef k(x_ptr, N: tl.constexpr):\n    tl.store(x_ptr, tl.exp2(1.0))\n")
    assert X.check_source("k.py", ok) == []
    # a changed file keeps the root's `os.environ` read, not more of `os`
    assert X.check_source("r.py", ROOT + "Y = 1\n", ROOT) == []
    found = X.check_source("r.py", ROOT + "os.system('true')\n", ROOT)
    assert any("os.system" in v or "'system'" in v for v in found), found


def _ratios(rng, center, spread, n=7):
    return [center + rng.gauss(0, spread) for _ in range(n)]


def test_ab_rule_never_promotes_noise_and_keeps_real_gains():
    spec = {"search": {"improve_eps": 0.05, "noise_k": 3.0}}
    rng = random.Random(0)
    # unchanged code under heavy CPU noise (per-round ratio spread up to 20%): never faster
    for spread in (0.02, 0.08, 0.2):
        for _ in range(300):
            v = ab_verdict(spec, {"objective_ratios": _ratios(rng, 1.0, spread)})
            assert not v["faster"], v
    for n in (7, 11):
        for _ in range(300):
            assert not ab_verdict(spec, {"objective_ratios": _ratios(rng, 1.0, 0.05, n)})["faster"]
    # a 10% gain with 1% noise is faster; the same gain drowned in 8% noise is not evidence
    assert ab_verdict(spec, {"objective_ratios": _ratios(rng, 0.9, 0.01)})["faster"]
    assert not ab_verdict(spec, {"objective_ratios": [0.9, 1.05, 0.75, 1.0, 0.8, 1.1, 0.7]})["faster"]
    # a 2x gain with one round hit by a stall of the shared machine: still faster with 11 rounds
    stalled = [0.5, 0.52, 0.49, 1.3, 0.51, 0.5, 0.48, 0.53, 0.5, 0.49, 0.51]
    v = ab_verdict(spec, {"objective_ratios": stalled})
    assert v["faster"] and v["wins"] == 10 and v["needed_wins"] == 10, v
    # too few rounds for the level: never faster, and said
    v = ab_verdict(spec, {"objective_ratios": [0.5] * 5})
    assert not v["faster"] and "ab_rounds" in v["why"]
    fields = {"verified": True, "fully_measured": True, "admissible": True, "objective_us": 1.0}
    ab = {"objective_ratios": [0.5] * 7, "incumbent": "I0003"}
    assert is_promotion(spec, fields, 10.0, ab, "I0003")
    assert not is_promotion(spec, fields, 10.0, ab, "I0004"), "measured against another incumbent"
    assert not is_promotion(spec, fields, 10.0, {"incumbent": "I0003"}, "I0003"), "an A/B audit without ratios"


# Device events of a torch.profiler trace of tik_v1 decode with split-KV merge (names as Triton emits
# them), plus the host-side events the parser must ignore and a foreign library kernel.
PROFILE = [
    {"name": "_attn_decode_kernel", "device_type": "DeviceType.CUDA"},
    {"name": "_attn_decode_merge_kernel", "device_type": "DeviceType.CUDA"},
    {"name": "aten::empty_like", "device_type": "DeviceType.CPU"},
    {"name": "cudaLaunchKernel", "device_type": "DeviceType.CPU"},
    {"name": "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
     "device_type": "DeviceType.CUDA"},
]


def test_profile_parsing():
    names = gpu_kernel_names(PROFILE)
    assert "aten::empty_like" not in names and len(names) == 3
    own = {"_attn_decode_kernel", "_attn_decode_merge_kernel", "_attn_fwd_kernel"}
    d = classify_kernels(names, own)
    assert d["own"] == ["_attn_decode_kernel", "_attn_decode_merge_kernel"] and d["foreign"] == []
    d = classify_kernels(names + ["flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>"], own)
    assert d["foreign"] == ["flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>"]
    assert classify_kernels(["void at::native::fill"], own)["own"] == []  # a memo: no own kernel ran


def test_ptx_counts():
    ptx = """
.visible .entry _attn_decode_kernel(
{
	ld.global.v4.b32 	{%r1, %r2, %r3, %r4}, [%rd1];
	@%p1 ld.global.b32 	%r5, [%rd2];
	ex2.approx.ftz.f32 	%f1, %f2;
	ex2.approx.ftz.f32 	%f3, %f4;
	fma.rn.f32 	%f5, %f1, %f3, %f5;
	mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f6, %f7, %f8, %f9}, {%r1, %r2}, {%r3}, {%f6, %f7, %f8, %f9};
	st.global.b32 	[%rd3], %r5;
	// ex2 in a comment
}"""
    assert ptx_counts(ptx) == {"ex2": 2, "fma": 1, "mma": 1, "ld.global": 2, "st.global": 1}

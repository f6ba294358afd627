"""devenv/gpu_stubs/sgl_kernel: raise mode names the function; FlashInfer mode forwards SGLang's fused-op
calls to the FlashInfer function of the same role, arguments unchanged, counted."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUBS = os.path.join(ROOT, "devenv", "gpu_stubs")

PROBE = r"""
import sys, types
calls = []
for mod, names in {"flashinfer.norm": ["rmsnorm", "fused_add_rmsnorm"], "flashinfer.activation": ["silu_and_mul"],
                   "flashinfer.rope": ["apply_rope_with_cos_sin_cache_inplace"],
                   "flashinfer.sampling": ["top_k_renorm_probs"]}.items():
    m = types.ModuleType(mod)
    for n in names:
        setattr(m, n, (lambda n: lambda *a, **k: calls.append((n, a, k)) or n)(n))
    sys.modules[mod] = m
sys.modules["flashinfer"] = types.ModuleType("flashinfer")
import sgl_kernel
assert sgl_kernel.rmsnorm("x", "w", 1e-6, out="o") == "rmsnorm"
sgl_kernel.fused_add_rmsnorm("x", "r", "w", 1e-5, enable_pdl=False)
sgl_kernel.silu_and_mul("x", "out")
sgl_kernel.top_k_renorm_prob("p", 5)
assert calls == [("rmsnorm", ("x", "w", 1e-6), {"out": "o"}), ("fused_add_rmsnorm", ("x", "r", "w", 1e-5),
                 {"enable_pdl": False}), ("silu_and_mul", ("x", "out"), {}), ("top_k_renorm_probs", ("p", 5), {})], calls
assert sgl_kernel.CALLS == {"rmsnorm": 1, "fused_add_rmsnorm": 1, "silu_and_mul": 1, "top_k_renorm_prob": 1}
try:
    sgl_kernel.merge_state("a")
except RuntimeError as e:
    assert "sgl_kernel stub: sgl_kernel.merge_state was called" in str(e)
else:
    raise AssertionError("unmapped function did not raise")
print("ok")
"""


def _run(mode):
    env = {**os.environ, "PYTHONPATH": STUBS, "TIK_SGL_KERNEL_SHIM": mode}
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env)


def test_flashinfer_mode_forwards_and_counts():
    r = _run("flashinfer")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-1500:]


def test_raise_mode_and_bad_mode():
    r = _run("raise")
    assert r.returncode != 0 and "sgl_kernel stub: sgl_kernel.rmsnorm was called" in r.stderr
    r = _run("fast")
    assert r.returncode != 0 and "TIK_SGL_KERNEL_SHIM: expected 'raise' or 'flashinfer'" in r.stderr


def test_proof_reads_the_shim_map_without_importing_it():
    import sys as _sys

    from benchmarks.sglang_gpu_proof import _shim_map

    before = list(_sys.meta_path)
    m = _shim_map()
    assert m["fused_add_rmsnorm"] == ("flashinfer.norm", "fused_add_rmsnorm") and "silu_and_mul" in m
    assert _sys.meta_path == before and "sgl_kernel" not in _sys.modules

"""kernels/tik_v9: tik_v8 with its Gluon GEMM served by the native host path's linear recipe.

On the GPU, tik_v8's contract failed ``native_served`` at Qwen3-4B o / down M 64: gemm_gluon launched through
attention_gluon's packed helper, which records nothing, so the public ``linear`` never learned a recipe and each
call paid the Python path (cold 33.7 us against tik_v6's 18.3 us at o M 64,
evidence/tik_v8/tik_v8-b3497fdd74fa-gemm.json). tik_v9 records the Gluon launch while the path learns (Triton's
own launch, with its compiled kernel) and lists ``_linear_gluon_ws`` among the manifest's ``linear_kernels``.

The CPU checks: tik_v9 differs from tik_v8 only there; the recorded launch of the Gluon kernel, compiled for
sm_90 by Triton (no GPU), gives a recipe whose descriptors are the maps of x and the weight and whose every other
parameter is the operand pointer or the constant Triton passes, and the C side derives exactly those parameters
for that call (bits: the same kernel, so the GPU contract's native_eager / native_graph checks)."""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import subprocess
import sys
import types

from areal_tik_plugin.search import edits as E
from tests.helpers.native_build import launcher_params, needs_triton36

ROOT = pathlib.Path(__file__).resolve().parents[2]
V8, V9 = ROOT / "kernels" / "tik_v8", ROOT / "kernels" / "tik_v9"


def test_tik_v9_is_tik_v8_with_the_gluon_launch_recorded():
    v8, v9 = E.read_files(str(V8)), E.read_files(str(V9))
    assert sorted(r for r in v9 if r.endswith(".py")) == sorted(r for r in v8 if r.endswith(".py"))
    assert [r for r in v9 if r.endswith(".py") and v9[r] != v8[r]] == ["gemm_gluon.py"]
    assert "R._RECORDS[-1].append((_linear_gluon_ws, grid, args, kw, _linear_gluon_ws[grid](*args, **kw)))" \
        in v9["gemm_gluon.py"]
    m8, m9 = (json.loads((p / "manifest.json").read_text()) for p in (V8, V9))
    assert m9["native_host_path"]["linear_kernels"] == m8["native_host_path"]["linear_kernels"] + ["_linear_gluon_ws"]
    assert m9["parent"] == "tik_v8" and "evidence_required" not in m9 and not (V9 / "search_evidence.jsonl").exists()


@needs_triton36
def test_gluon_gemm_recipe_from_the_recorded_sm90_launch():
    """Runs in a fresh interpreter: compiling for sm_90 needs a Triton without the interpreter state."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "import tests.kernels.test_tik_v9 as t; t._recipe_check(); print('OK')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900, cwd=str(ROOT), env=env)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


class _CompileOnLaunch:
    """Stands in for the Gluon kernel object on a CPU box: ``[grid](*args, **kw)`` compiles the kernel for sm_90
    with the launch's signature and returns the compiled kernel, as Triton's launch would (without running it)."""

    def __init__(self, real, compiled: list):
        self.fn, self.params, self.__name__, self._real, self.compiled = real.fn, real.params, real.__name__, real, compiled

    def __getitem__(self, grid):
        def launch(*args, **kw):
            import torch
            import triton
            from triton.backends.compiler import GPUTarget
            from triton.experimental.gluon._runtime import GluonASTSource
            from triton.runtime.jit import mangle_type

            dts = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32"}
            sig, cx = {}, {}
            for p, v in zip(self.params, list(args) + [None] * (len(self.params) - len(args))):
                if p.is_constexpr:
                    cx[p.name] = kw.get(p.name, p.default)
                    sig[p.name] = "constexpr"
                elif isinstance(v, torch.Tensor):
                    sig[p.name] = dts[v.dtype]
                elif isinstance(v, int):
                    sig[p.name] = "i32"
                else:
                    sig[p.name] = mangle_type(v)
            c = triton.compile(GluonASTSource(self._real, sig, constexprs=cx), target=GPUTarget("cuda", 90, 32),
                               options={"num_warps": kw["num_warps"], "enable_fp_fusion": kw["enable_fp_fusion"]})
            # not loaded on a device, so no function handle: a stand-in one, as tests/runtime does
            k = types.SimpleNamespace(src=c.src, metadata=c.metadata, function=0x1234)
            self.compiled.append(k)
            return k

        return launch


def _recipe_check():
    import tempfile

    import torch

    sys.path.insert(0, str(ROOT))
    os.environ["TIK_CACHE_DIR"] = tempfile.mkdtemp()
    from areal_tik_plugin.runtime import native
    from areal_tik_plugin.runtime.native import launch as NL
    from benchmarks.compile_gluon_sm90 import _load

    mod = native.load_module(native.build())
    mod.setup_cpu(torch)
    g = _load(str(V9), "gemm_gluon", "test_tik_v9")
    R = g.R
    table = json.loads((V9 / "manifest.json").read_text())["native_host_path"]
    native.host_path_table = lambda impl=None: table
    compiled: list = []
    g._linear_gluon_ws = _CompileOnLaunch(g._linear_gluon_ws, compiled)
    AG = importlib.import_module(g.__name__.rpartition(".")[0] + ".attention_gluon")
    helper: list = []
    AG._launch = lambda fn, grid, args, kw: helper.append(fn)   # the packed helper (the loader wraps it natively)
    # the rule's shapes: Qwen3-4B o at M 64 (64-row tiles) without bias, down at M 256 (128-row tiles) with one
    for M, N, K, bias in ((64, 2560, 4096, False), (256, 2560, 9728, True)):
        torch.manual_seed(M)
        x = torch.randn(M, K).to(torch.bfloat16)
        w = torch.randn(N, K).to(torch.bfloat16)
        b = torch.randn(N).to(torch.bfloat16) if bias else None
        y = torch.empty(M, N, dtype=torch.bfloat16)
        chunk = 2048 if K > 8192 else K
        cfg = g.config(BLOCK_N=64, split=0, stages=g.STAGES[64, 1 if M <= 64 else 2], halves=1 if M <= 64 else 2)
        g.linear(x, w, b, y, chunk, 132, cfg)          # not recording: attention_gluon's helper, nothing kept
        assert helper == [g._linear_gluon_ws] and not compiled
        helper.clear()
        out, rec = native.recorded(R._RECORDS, lambda: g.linear(x, w, b, y, chunk, 132, cfg))
        assert out is y and len(rec) == 1 and len(compiled) == 1 and not helper
        fn, grid, args, kw, kernel = rec[0]
        assert kernel is compiled[0] and getattr(fn, "__name__", None) == "_linear_gluon_ws"
        recipe, why = native.linear_recipe(R._TICKETS, x, w, b, y, rec)
        assert recipe is not None, why
        params = recipe[1]
        descs = [v for k, v in params if k == native.R_DESC]
        assert [d[0] for d in descs] == [native.R_X, native.R_W]
        for d, t in zip(descs, (x, w)):
            assert d[6] == tuple(t.shape) and d[7] == tuple(t.stride())
        ptrs = [k for k, _ in params if k in (native.R_X, native.R_W, native.R_B, native.R_Y)]
        # Y, P and CNT (unread when unsplit) are the output; Bias the bias, or the output when there is none
        assert ptrs == [native.R_Y, native.R_Y, native.R_B if bias else native.R_Y, native.R_Y], ptrs
        ints = [v for k, v in params if k == native.R_I32]
        assert ints[-7:] == [M, N, K, y.stride(0), *args[-3:]]
        mod.invalidate()
        assert mod.learn_linear(x, w, b, recipe, None) is True
        want = launcher_params(args)
        assert mod.linear_derive(x, w, b, y, (), False) == want
        y2 = torch.empty_like(y)   # another output: only its pointers change
        assert mod.linear_derive(x, w, b, y2, (), False) == [
            (k, y2.data_ptr() if (k, v) == (NL.GP_PTR, y.data_ptr()) else v) for k, v in want]
        mod.invalidate()
        compiled.clear()

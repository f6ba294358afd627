"""The trimmed FlashInfer wheel (devenv/flashinfer_wheel.py): the include scan on small synthetic trees,
and, where the PyPI wheel is cached (~/.cache/tik-fi; CI does not download 100 MB per run), that the
trimmed wheel installs into a temp dir, carries every JIT source and header closure, and imports."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

from devenv import flashinfer_wheel as fw


def test_header_closure_follows_quoted_and_angle_includes_through_include_dirs():
    files = {
        "flashinfer/data/csrc/norm.cu": '#include "tvm_ffi_utils.h"\n#include <flashinfer/norm.cuh>\n#include <cuda_runtime.h>',
        "flashinfer/data/csrc/tvm_ffi_utils.h": "#include <tvm/ffi/function.h>\n",
        "flashinfer/data/include/flashinfer/norm.cuh": '#include "utils.cuh"\n#if X\n#include <cute/tensor.hpp>\n#endif',
        "flashinfer/data/include/flashinfer/utils.cuh": "",
        "flashinfer/data/cutlass/include/cute/tensor.hpp": '#include "cute/../cute/layout.hpp"',
        "flashinfer/data/cutlass/include/cute/layout.hpp": "",
        "flashinfer/data/include/flashinfer/unused.cuh": "",
    }
    kept, unresolved = fw.header_closure(set(files), files.__getitem__, ["flashinfer/data/csrc/norm.cu"])
    assert kept == set(files) - {"flashinfer/data/include/flashinfer/unused.cuh"}
    assert unresolved == {"tvm/ffi/function.h", "cuda_runtime.h"}


def test_header_closure_expands_computed_includes_to_the_vendored_cccl():
    # CUTLASS names CCCL headers through a macro (`#include CUDA_STD_HEADER(utility)`); a scan that misses
    # it drops the vendored <cuda/std/utility>, and nvcc then mixes in the toolkit's own CCCL release
    files = {
        "flashinfer/data/csrc/norm.cu": "#include <cutlass/fast_math.h>",
        "flashinfer/data/cutlass/include/cutlass/fast_math.h":
            "#if defined(__CUDACC_RTC__)\n#include CUDA_STD_HEADER(cstdint)\n#endif\n"
            "  #  include CUDA_STD_HEADER( utility )\n// a comment: #include this header first\n"
            "#include THRUST_MR_STD_MR_HEADER\n#include SOME_BODY_FILE\n",
        "flashinfer/data/cccl/libcudacxx/include/cuda/std/utility": '#include "__utility/pair.h"',
        "flashinfer/data/cccl/libcudacxx/include/cuda/std/__utility/pair.h": "",
        "flashinfer/data/cccl/libcudacxx/include/cuda/std/cstdint": "",
        "flashinfer/data/cccl/libcudacxx/include/cuda/std/tuple": "",
    }
    kept, unresolved = fw.header_closure(set(files), files.__getitem__, ["flashinfer/data/csrc/norm.cu"])
    assert kept == set(files) - {"flashinfer/data/cccl/libcudacxx/include/cuda/std/tuple"}
    assert unresolved == {"memory_resource", "<SOME_BODY_FILE>"}
    m = fw.manifest(list(files), files.__getitem__)
    assert m["unknown_computed"] == ["SOME_BODY_FILE"] and m["unresolved"] == ["memory_resource"]


def test_manifest_keeps_python_drops_other_gpus_and_unused_data():
    names = ["flashinfer/__init__.py", "flashinfer/norm/__init__.py", "flashinfer/experimental/b12x/x.py",
             "flashinfer/data/csrc/norm.cu", "flashinfer/data/csrc/unused.cu", "flashinfer/moe_ep/a.py",
             "flashinfer_python-0.7.4.dist-info/METADATA", "flashinfer_python-0.7.4.dist-info/RECORD",
             "flashinfer/jit/activation.py", "flashinfer/data/include/flashinfer/activation.cuh"]
    texts = {"flashinfer/jit/activation.py": "s = '''#include <flashinfer/activation.cuh>'''"}
    m = fw.manifest(names, lambda p: texts.get(p, ""))
    assert "flashinfer/data/csrc/norm.cu" in m["keep"]
    assert "flashinfer/data/include/flashinfer/activation.cuh" in m["keep"]  # named by Python-embedded C++
    assert "flashinfer/data/csrc/unused.cu" not in m["keep"]
    assert "flashinfer/experimental/b12x/x.py" not in m["keep"] and "flashinfer/moe_ep/a.py" not in m["keep"]
    assert "flashinfer/__init__.py" in m["keep"] and "flashinfer/norm/__init__.py" in m["keep"]
    assert not any(k.endswith("RECORD") for k in m["keep"])  # rewritten by trim()
    assert "rope.cu" in m["missing_sources"]


CACHED = os.path.join(fw.CACHE, fw.WHEEL)


@pytest.fixture(scope="module")
def trimmed(tmp_path_factory):
    if not os.path.exists(CACHED):
        pytest.skip(f"{CACHED} not cached (python -m devenv.flashinfer_wheel DEST downloads it once)")
    d = tmp_path_factory.mktemp("whl")
    m = fw.trim(CACHED, str(d), level=1)  # the size check below allows for the weaker compression
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), m["wheel"]], check=True)
    return m, site


def test_trimmed_wheel_fits_and_carries_every_jit_source(trimmed):
    m, site = trimmed
    assert not m["missing_sources"] and not m["unknown_computed"]
    assert m["after_mib"] <= fw.LIMIT_MIB
    for s in fw.JIT_SOURCES:
        assert (site / "flashinfer/data/csrc" / s).is_file(), s
    for h in ("flashinfer/data/include/flashinfer/norm.cuh", "flashinfer/data/include/flashinfer/pos_enc.cuh",
              "flashinfer/data/include/flashinfer/activation.cuh", "flashinfer/data/csrc/tvm_ffi_utils.h",
              "flashinfer/data/include/flashinfer/attention/hopper/variants.cuh",
              # reached only through CUTLASS's `#include CUDA_STD_HEADER(utility)` (FA3's sm90 kernels)
              "flashinfer/data/cccl/libcudacxx/include/cuda/std/utility"):
        assert (site / h).is_file(), h
    with zipfile.ZipFile(m["wheel"]) as z:  # RECORD lists exactly the files carried
        rec = [ln.split(",")[0] for ln in z.read(next(n for n in z.namelist() if n.endswith("RECORD")))
               .decode().splitlines() if ln]
        assert sorted(rec) == sorted(z.namelist())


def test_trimmed_wheel_imports_the_benchmarked_modules(trimmed):
    _, site = trimmed
    needs = ("tvm_ffi", "pynvml", "einops", "tabulate")
    missing = [n for n in needs if subprocess.run([sys.executable, "-c", f"import {n}"], capture_output=True).returncode]
    if missing:
        pytest.skip(f"FlashInfer's import-time requirements absent here: {missing}")
    # the JIT specs of every module the benchmarks build render (templates -> generated sources) and name
    # only files that exist, and their ninja files write (no compiler needed for either)
    code = ("import torch, flashinfer, flashinfer.norm, flashinfer.rope, flashinfer.activation, flashinfer.page, "
            "flashinfer.decode, flashinfer.prefill\n"
            "from flashinfer.jit import norm, rope, activation, sampling, page, cascade\n"
            "from flashinfer.jit.attention import modules as M\n"
            "bf = torch.bfloat16\n"
            "specs = [norm.gen_norm_module(), rope.gen_rope_module(), activation.gen_act_and_mul_module('silu'),"
            " sampling.gen_sampling_module(), page.gen_page_module(), cascade.gen_cascade_module(),"
            " M.gen_batch_decode_module(bf, bf, bf, torch.int32, 128, 128, 0, False, False)]\n"
            "specs += [M.gen_batch_prefill_module(b, bf, bf, bf, torch.int32, 128, 128, 0, False, False, False)"
            " for b in ('fa2', 'fa3')]\n"
            "for s in specs:\n"
            "    assert s.sources and all(p.is_file() for p in s.sources), s.name\n"
            "    s.write_ninja()\n"
            "print(flashinfer.__version__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(site), "FLASHINFER_USE_CUDA_NORM": "1",
                            "FLASHINFER_CUDA_ARCH_LIST": "9.0a", "FLASHINFER_WORKSPACE_BASE": str(site.parent / "ws")})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == fw.VERSION


def test_sglang_prebuild_job_names_the_modules_sglangs_flashinfer_backend_plans(trimmed):
    """The URIs of benchmarks.flashinfer_prebuild's sgl_* jobs, in the JIT cache SGLang's engine uses, are
    the ones FlashInfer's own wrapper code
    asks its JIT cache for when planned as SGLang's flashinfer backend plans them for the proof's qwen3-4b
    shape: each wrapper's plan runs on the CPU up to its module fetch, which records the URI and stops
    (no kernel is built or run); sm90 is answered as the H200 answers it, so the ragged "auto" picks FA3."""
    _, site = trimmed
    needs = ("tvm_ffi", "pynvml", "einops", "tabulate")
    missing = [n for n in needs if subprocess.run([sys.executable, "-c", f"import {n}"], capture_output=True).returncode]
    if missing:
        pytest.skip(f"FlashInfer's import-time requirements absent here: {missing}")
    code = (
        "import os\n"
        "from benchmarks import flashinfer_prebuild as FP\n"
        "FP.sglang_process_setup()\n"
        "import json, torch, flashinfer.prefill as P, flashinfer.decode as D, flashinfer.utils as U\n"
        "from flashinfer.jit import env as E\n"
        "from flashinfer.jit.attention.modules import get_batch_prefill_uri, get_batch_decode_uri\n"
        "asked = []\n"
        "class Fetched(Exception):\n    pass\n"
        "def prefill(backend, *args):\n    asked.append(get_batch_prefill_uri(backend, *args)); raise Fetched\n"
        "def decode(*args):\n    asked.append(get_batch_decode_uri(*args)); raise Fetched\n"
        "P.get_batch_prefill_module = D.get_batch_prefill_module = prefill\n"
        "D.get_batch_decode_module = decode\n"
        "U.is_sm90a_supported = lambda device: True\n"
        "_empty = torch.empty\n"  # the wrappers pin host buffers, which needs CUDA
        "torch.empty = lambda *a, pin_memory=False, **k: _empty(*a, **k)\n"
        "tc = FP.sglang_tensor_cores(32, 8, torch.bfloat16)\n"
        "for part in ('ragged', 'paged', 'decode'):\n"
        "    try:\n        FP.plan_like_sglang(part, 'cpu', tc)\n    except Fetched:\n        pass\n"
        "specs = FP.sglang_specs(tc, sm90=True)\n"
        "print(json.dumps({'tc': tc, 'asked': asked, 'job': {k: [s.name for s in v] for k, v in specs.items()},"
        " 'jit_dir': str(E.FLASHINFER_JIT_DIR)}))\n")
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join([str(site), repo, os.path.join(repo, "devenv", "cpu_stubs")])  # SGLang imports torchvision
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo,
                       env={**{k: v for k, v in os.environ.items() if k != "FLASHINFER_WORKSPACE_BASE"},
                            "PYTHONPATH": path, "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
                            "SGLANG_CACHE_DIR": str(site.parent / "sgl-cache")})
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # the JIT cache SGLang's engine reads: FlashInfer's workspace redirected under SGLANG_CACHE_DIR
    assert got["jit_dir"].startswith(str(site.parent / "sgl-cache" / ".cache" / "flashinfer")), got["jit_dir"]
    assert got["tc"] is True  # GQA 4 on bf16: SGLang decodes with tensor cores (the FA2 prefill module)
    job = got["job"]
    assert got["asked"] == [job["sgl_ragged"][0], job["sgl_paged"][0], job["sgl_decode"][0]]
    assert job["sgl_ragged"][0].endswith("_sm90") and not job["sgl_paged"][0].endswith("_sm90")
    assert {n for k in ("sgl_cascade", "sgl_norm", "sgl_activation", "sgl_sampling") for n in job[k]} == \
        {"cascade", "norm", "silu_and_mul", "sampling"}


def test_sglang_backend_source_constructs_the_wrappers_plan_like_sglang_builds():
    """plan_like_sglang copies SGLang 0.5.23's wrapper construction; a SGLang whose backend builds them
    otherwise must fail here rather than leave the proof's baseline compiling at engine start."""
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None:
        pytest.skip("SGLang not installed")
    src = open(os.path.join(os.path.dirname(spec.origin), "srt", "layers", "attention", "flashinfer_backend.py")).read()
    flat = " ".join(src.split())
    for needle in ('self.prefill_backend = "fa2"', 'self.decode_backend = "fa2"', 'fmha_backend = "auto"',
                   'BatchPrefillWithRaggedKVCacheWrapper( self.workspace_buffer, "NHD", backend=fmha_backend )',
                   'BatchPrefillWithPagedKVCacheWrapper( self.workspace_buffer, "NHD", backend=self.prefill_backend, )',
                   'backend=self.decode_backend, use_tensor_cores=self.decode_use_tensor_cores,',
                   "from flashinfer.cascade import merge_state"):
        assert needle in flat, needle
    # the shim's FlashInfer ops (benchmarks/sglang_gpu_proof's baseline) are the job's, RoPE aside: SGLang's
    # rotary embedding calls its own JIT kernel (sglang.kernels.ops.attention.rope), not sgl_kernel's
    from benchmarks.sglang_gpu_proof import _shim_map

    assert {m for m, _ in _shim_map().values()} == {"flashinfer.norm", "flashinfer.activation", "flashinfer.rope",
                                                    "flashinfer.sampling"}
    rope = open(os.path.join(os.path.dirname(spec.origin), "srt", "layers", "rotary_embedding", "base.py")).read()
    assert "from sglang.kernels.ops.attention.rope import apply_rope_with_cos_sin_cache_inplace" in rope


def test_prebuild_check_accepts_the_kv_stride_variant_the_run_resolved(tmp_path):
    """FA2 paged prefill picks its KV-stride specialization from the tensors at run time (on the H200 the
    planned module came out as ``..._kv_stride_equal``): that build counts; a module built under no name
    of the spec's family does not."""
    from benchmarks import flashinfer_prebuild as P

    class Spec:
        name = "batch_prefill_x"
        is_compiled = False

        def get_library_path(self):
            return tmp_path / self.name / f"{self.name}.so"

    sp = Spec()
    assert not P._compiled(sp)
    with pytest.raises(RuntimeError, match="batch_prefill_x"):
        P._check_compiled([sp])
    (tmp_path / "batch_prefill_x_kv_stride_equal").mkdir()
    (tmp_path / "batch_prefill_x_kv_stride_equal" / "batch_prefill_x_kv_stride_equal.so").write_bytes(b"")
    assert P._compiled(sp)
    P._check_compiled([sp])

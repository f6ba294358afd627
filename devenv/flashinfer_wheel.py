"""A trimmed ``flashinfer-python`` wheel for the offline H200 (the PyPI wheel is ~100 MB; one device call
carries at most 64 MiB with the working tree).

    python -m devenv.flashinfer_wheel .whl-fi          # here (network or ~/.cache/tik-fi), prints the size
    # there (bash benchmarks/gpu_baselines.sh does this):
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl-fi/*.whl

FlashInfer ships no compiled kernels in this wheel: every kernel the benchmarks use is JIT-compiled on the
GPU machine (nvcc + ninja there) from the wheel's ``data/`` sources. The trimmed wheel keeps

* the Python modules of the package except :data:`DROP_PY_DIRS` (subpackages for other GPUs and other
  ops, which neither ``import flashinfer`` nor the benchmarked modules import);
* of ``data/``, only the JIT sources of the modules the benchmarks build for sm_90 (:data:`JIT_SOURCES`:
  RMSNorm / fused add+RMSNorm, RoPE, SiLU-and-mul, paged-KV append, sampling / renorm (the sgl_kernel
  shim's top-k / top-p), merge_state (cascade: SGLang's flashinfer backend merges the ragged and paged
  halves of a prefill with a cached prefix), batch/single decode, batch/single prefill FA2 and FA3
  (sm90)) and the transitive closure of the headers they include, resolved against the include directories FlashInfer's JIT passes to nvcc (its own ``include``, ``csrc``, the vendored
  CUTLASS, spdlog and CCCL). The scan follows every ``#include`` regardless of ``#if`` guards, so it keeps
  a superset of what one configuration compiles; includes named by a macro (CUTLASS's
  ``#include CUDA_STD_HEADER(utility)``, Thrust's system headers) are expanded by :data:`MACRO_INCLUDES`,
  and a kept file with one it does not know fails the build. Headers found in none of those directories come from
  the CUDA toolkit, the system or ``tvm_ffi`` (carried as its own wheel).

Runtime requirements that the H200 image lacks are carried as wheels too (:data:`CARRIED_DEPS`);
those it has are listed in :data:`ON_IMAGE`. The CUDA-DSL / cuDNN-frontend / NCCL extras FlashInfer
declares are used only by kernels these benchmarks do not call and are not carried.
"""

from __future__ import annotations

import argparse
import hashlib
import base64
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

VERSION = "0.7.4"
WHEEL = f"flashinfer_python-{VERSION}-py3-none-any.whl"
CACHE = os.path.expanduser(os.environ.get("TIK_FI_CACHE", "~/.cache/tik-fi"))
# FlashInfer requirements not on the H200 image, as wheels (pinned: one version each on the machine)
CARRIED_DEPS = ["apache-tvm-ffi==0.1.11"]
# FlashInfer requirements the H200 image has (KINDS.md package list)
ON_IMAGE = ["click", "einops", "ninja", "numpy", "nvidia-ml-py", "packaging", "requests", "tabulate", "torch",
            "tqdm", "cuda-bindings"]
LIMIT_MIB = 40.0  # the budget left for this wheel beside the tree (~14 MB) and the other carried wheels

# csrc-relative JIT sources (and the templates they are rendered from) of the modules the benchmarks build
JIT_SOURCES = (
    "norm.cu", "flashinfer_norm_binding.cu",
    "rope.cu", "flashinfer_rope_binding.cu",
    "page.cu", "flashinfer_page_binding.cu",
    "sampling.cu", "renorm.cu", "flashinfer_sampling_binding.cu",
    "cascade.cu", "flashinfer_cascade_binding.cu",
    "batch_decode.cu", "batch_decode_jit_binding.cu", "batch_decode_customize_config.jinja",
    "batch_decode_kernel_inst.jinja",
    "single_decode.cu", "single_decode_jit_binding.cu", "single_decode_customize_config.jinja",
    "single_decode_kernel_inst.jinja",
    "batch_prefill.cu", "batch_prefill_jit_binding.cu", "batch_prefill_paged.cu",
    "batch_prefill_paged_jit_binding.cu", "batch_prefill_paged.cuh", "batch_prefill_customize_config.jinja",
    "batch_prefill_paged_kernel_inst.jinja", "batch_prefill_ragged_kernel_inst.jinja",
    "batch_prefill_sm90.cu", "batch_prefill_sm90_jit_binding.cu", "batch_prefill_sm90_customize_config.jinja",
    "batch_prefill_paged_sm90_kernel_inst.jinja", "batch_prefill_ragged_sm90_kernel_inst.jinja",
    "single_prefill.cu", "single_prefill_jit_binding.cu", "single_prefill_customize_config.jinja",
    "single_prefill_kernel_inst.jinja",
    "single_prefill_sm90.cu", "single_prefill_sm90_jit_binding.cu", "single_prefill_sm90_customize_config.jinja",
    "single_prefill_sm90_kernel_inst.jinja",
)
# Python files whose embedded C++ (rendered into generated sources) names headers too
PY_WITH_CXX = ("flashinfer/jit/activation.py", "flashinfer/jit/attention/modules.py",
               "flashinfer/jit/attention/utils.py", "flashinfer/jit/utils.py")
# The include directories FlashInfer's JIT passes to nvcc (jit/env.py, jit/cpp_ext.py), wheel-relative
INCLUDE_DIRS = (
    "flashinfer/data/include", "flashinfer/data/csrc", "flashinfer/data/cutlass/include",
    "flashinfer/data/cutlass/tools/util/include", "flashinfer/data/spdlog/include",
    "flashinfer/data/cccl/cub", "flashinfer/data/cccl/libcudacxx/include", "flashinfer/data/cccl/thrust",
)
# Python subpackages (package-relative) that neither ``import flashinfer`` nor the modules the benchmarks
# use (norm, rope, activation, page, decode, prefill, their JIT generators) import, eagerly or on the
# sm_90 paths they take: other GPUs' kernels (sm100/sm110/sm120), MoE/EP/communication backends, CuTe-DSL
# and cuTile kernels of other ops, experimental model blocks. Found by an import trace of those modules;
# every folder beside a traced module is kept (lazy imports between siblings).
DROP_PY_DIRS = (
    "batch_invariant/", "cake_causal_conv1d_train_backend/", "cake_fused_qk_rope_append_backend/",
    "cake_fused_qk_rope_fp8_append_backend/", "cake_mhc_train_backend/", "cake_mhc_train_head_backend/",
    "cake_nvfp4_svdquant_gemm_backend/", "cake_sage_block_sparse_attention_backend/",
    "cake_tp_moe_finalize_rmsnorm_backend/", "cake_ulysses_backend/", "cake_vsa_sm90_backend/",
    "diffusion_ops/", "dsv3_ops/", "experimental/allreduce_mhc_post_prenorm/", "experimental/attn_scores/",
    "experimental/b12x/", "experimental/balanced_gqa_decode/", "experimental/cake/",
    "experimental/cake_dsa_indexer/", "experimental/cake_dsa_indexer_det/", "experimental/cake_dsa_train/",
    "experimental/cake_fp8_attention/", "experimental/cake_gdn_det_train/",
    "experimental/cake_gdn_det_train_kcp/", "experimental/cake_gdn_train/",
    "experimental/cake_gdn_train_kcp/", "experimental/cake_gqa_train/", "experimental/cake_kda_det_train/",
    "experimental/cake_kda_det_train_kcp/", "experimental/cake_kda_train/",
    "experimental/cake_kda_train_kcp/", "experimental/cake_kimi_k3_attn_res/",
    "experimental/cake_lm_head_det_loss/", "experimental/cake_lm_head_loss/",
    "experimental/cake_mla_nvfp4_paged_decode/", "experimental/cake_mla_varq_dcp_decode/",
    "experimental/cake_moe_grouped_det_gemm/", "experimental/cake_moe_grouped_gemm/",
    "experimental/cake_mok_bf16/", "experimental/cake_msa_icp_indexer/",
    "experimental/cake_mxfp8_megamoe_ep16/", "experimental/cake_nvfp4_ptilemax_attention/",
    "experimental/cake_qsa_nvfp4/", "experimental/cake_rubin_mla_nvfp4_decode/",
    "experimental/cake_stepfun_moe/", "experimental/cake_w8a8_megamoe_ep16/",
    "experimental/cudnn_frost_selected_kernels_moe_grouped_gemm/", "experimental/deepgemm_batched_gemm/",
    "experimental/deepgemm_common/", "experimental/deepgemm_dense_mqa/", "experimental/deepgemm_fp4_gemm/",
    "experimental/deepgemm_fp8_gemm/", "experimental/deepgemm_kgroup_gemm/",
    "experimental/deepgemm_mega_gate/", "experimental/deepgemm_mega_mhc/",
    "experimental/deepgemm_mixed_gemm/", "experimental/deepgemm_sm120_paged_mqa_logits/",
    "experimental/deepgemm_sparse_mqa/", "experimental/deepseek_v41/",
    "experimental/dense_projection_det_gemm/", "experimental/dense_projection_gemm/",
    "experimental/gdn_sm120_cute/", "experimental/kda_prefill_wrapper/",
    "experimental/kimi_k3_fp8_projection/", "experimental/kimi_k3_fused_router/",
    "experimental/kimi_k3_latent_moe/", "experimental/kimi_k3_tp12_tail/",
    "experimental/kimi_k3_vision_tower/", "experimental/mega_moe_v3/", "experimental/mhc_fused_post_pre/",
    "experimental/mhc_pre_big_fuse_with_norm/", "experimental/minimax_h3_varlen_attention/",
    "experimental/msa_nvfp4_decode/", "experimental/nvfp4_attention/", "experimental/nvfp4_mla_decode/",
    "experimental/nvfp4_sparse_mla_decode/", "experimental/qsa_nvfp4/", "experimental/qwen_3_5_block/",
    "experimental/qwen_3_5_gdn_block/", "experimental/qwen_3_8_block/", "experimental/sm110_gqa_decode/",
    "experimental/sm110_xqa/", "experimental/sm120_dsa_indexer/", "fused_moe/backends/cudnn_frost/artifacts/",
    "fused_moe/backends/frost_low_latency/fma/bf16/", "fused_moe/backends/frost_low_latency/fma/mxfp8/",
    "fused_moe/backends/frost_low_latency/fma/nvfp4/", "fused_moe/backends/frost_low_latency/tc/",
    "fused_moe/backends/prims_ts/", "fused_moe/cake/", "fused_moe/cake_cute/",
    "fused_moe/cute_dsl/blackwell/", "fused_moe/cute_dsl/blackwell_sm12x/", "fused_moe/cute_dsl/common/",
    "fused_moe/cute_dsl/hopper/", "fused_moe/cute_dsl/rubin/", "fused_moe/cutile/",
    "gdn_kernels/experimental/kernel/", "gemm/batch_invariant/", "gemm/kernels/cute_dsl/",
    "gemm/kernels/cutile/", "gemm/kernels/sm12x_cute/", "kda_kernels/persistent/", "kda_kernels/ptx/",
    "kda_kernels/tirx/", "mla/_sparse_mla_sm120/", "moe_ep/", "msa_ops/cute_dsl/", "parallel_attention/",
    "prims_ts/batched_gemm/", "prims_ts/moe/", "sdsa/", "topk_varlen/kernels/", "trace_apply/",
)
CSRC = "flashinfer/data/csrc/"
# data/ files FlashInfer reads at import or build time besides sources (small)
DATA_KEEP_PREFIXES = ("flashinfer/data/build_backend.py", "flashinfer/data/build_utils.py")

_INCLUDE = re.compile(r'#\s*include\s*[<"]([^>"]+)[>"]')
# an include whose name is a macro (a computed include), at the start of a line (prose in comments names
# "#include this" and the like mid-line): `#include CUDA_STD_HEADER(utility)`, `#include THRUST_MR_STD_MR_HEADER`
_MACRO_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+([A-Za-z_]\w*)(?:[ \t]*\([ \t]*([^)]*?)[ \t]*\))?', re.M)
# What the computed includes of the vendored headers name in a CUDA build, ``{}`` the macro's argument
# (from the macros' definitions: cutlass/cutlass.h; thrust/detail/config/{device,host}_system.h with the
# CUDA device system and the CPP host system, universal_{vector,allocator}.h; memory_resource.h names a
# standard header). CUTLASS and CuTe reach CCCL's <cuda/std/...> this way only: missed, nvcc would take
# those headers from the toolkit's own (other) CCCL release instead of the vendored one.
MACRO_INCLUDES = {
    "CUDA_STD_HEADER": "cuda/std/{}",
    "__THRUST_DEVICE_SYSTEM_ALGORITH_HEADER_INCLUDE": "thrust/system/cuda/{}",
    "__THRUST_DEVICE_SYSTEM_ALGORITH_DETAIL_HEADER_INCLUDE": "thrust/system/cuda/detail/{}",
    "__THRUST_HOST_SYSTEM_ALGORITH_HEADER_INCLUDE": "thrust/system/cpp/{}",
    "__THRUST_HOST_SYSTEM_ALGORITH_DETAIL_HEADER_INCLUDE": "thrust/system/cpp/detail/{}",
    "__THRUST_DEVICE_SYSTEM_MEMORY_HEADER": "thrust/system/cuda/memory.h",
    "__THRUST_DEVICE_SYSTEM_VECTOR_HEADER": "thrust/system/cuda/vector.h",
    "THRUST_MR_STD_MR_HEADER": "memory_resource",
}


def includes_of(text: str) -> list[str]:
    """Header names a source includes, computed includes expanded by :data:`MACRO_INCLUDES` (an unknown
    macro yields ``"<MACRO(arg)>"`` or ``"<MACRO>"``, which resolves nowhere and so lands in the unresolved set)."""
    names = _INCLUDE.findall(text)
    for macro, arg in _MACRO_INCLUDE.findall(text):
        form = MACRO_INCLUDES.get(macro)
        names.append(form.format(arg) if form is not None else f"<{macro}({arg})>" if arg else f"<{macro}>")
    return names


def header_closure(names: set[str], read, seeds: list[str], extra_texts: list[str] = ()) -> tuple[set[str], set[str]]:
    """Wheel paths reachable from ``seeds`` (wheel paths) by ``#include`` (plus includes named in
    ``extra_texts``), resolved like nvcc does: first the including file's folder for quoted names, then
    INCLUDE_DIRS in order. ``names``: every path in the wheel; ``read(path) -> str``.
    Returns (kept paths, unresolved include names: the toolkit's / system's / tvm_ffi's)."""
    kept, unresolved = set(), set()
    todo = [(s, None) for s in seeds] + [(None, t) for t in extra_texts]
    while todo:
        path, text = todo.pop()
        if path is not None:
            if path in kept:
                continue
            kept.add(path)
            text = read(path)
            here = path.rsplit("/", 1)[0]
        else:
            here = None
        for inc in includes_of(text):
            cands = ([f"{here}/{inc}"] if here else []) + [f"{d}/{inc}" for d in INCLUDE_DIRS]
            hit = next((_norm(c) for c in cands if _norm(c) in names), None)
            if hit is None:
                unresolved.add(inc)
            elif hit not in kept:
                todo.append((hit, None))
    return kept, unresolved


def _norm(p: str) -> str:
    out = []
    for part in p.split("/"):
        if part == "..":
            if out:
                out.pop()
        elif part not in ("", "."):
            out.append(part)
    return "/".join(out)


def manifest(names: list[str], read) -> dict:
    """Which wheel paths the trimmed wheel keeps, and why: ``{"keep": sorted paths, "sources": [...],
    "headers": n, "unresolved": sorted include names, "unknown_computed": computed includes (``MACRO(arg)``)
    of kept files that :data:`MACRO_INCLUDES` does not expand, "missing_sources": [...]}``."""
    nameset = set(names)
    missing = [s for s in JIT_SOURCES if CSRC + s not in nameset]
    seeds = [CSRC + s for s in JIT_SOURCES if CSRC + s in nameset]
    extra = [read(p) for p in PY_WITH_CXX if p in nameset]
    data_kept, unresolved = header_closure(nameset, read, seeds, extra)
    keep = set(data_kept)
    for n in names:
        if n.endswith("/"):
            continue
        if n.startswith("flashinfer/data/"):
            if n.startswith(DATA_KEEP_PREFIXES):
                keep.add(n)
        elif n.startswith(tuple("flashinfer/" + d for d in DROP_PY_DIRS)):
            continue
        elif n.startswith("flashinfer/") and n.endswith(".py"):
            keep.add(n)
        elif ".dist-info/" in n and not n.endswith("/RECORD"):
            keep.add(n)
        elif n.startswith("flashinfer/") and n.endswith((".json", ".txt", ".typed")) and "/data/" not in n:
            keep.add(n)  # small config tables some modules read at import
    return {"keep": sorted(keep), "sources": seeds, "headers": len(data_kept) - len(seeds),
            "unresolved": sorted(u for u in unresolved if not u.startswith("<")),
            "unknown_computed": sorted(u[1:-1] for u in unresolved if u.startswith("<")), "missing_sources": missing}


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def trim(src: str, dest_dir: str, level: int = 9) -> dict:
    """Write the trimmed wheel (same file name) into ``dest_dir``; returns the manifest plus sizes."""
    with zipfile.ZipFile(src) as zin:
        names = zin.namelist()
        m = manifest(names, lambda p: zin.read(p).decode("utf-8", "replace"))
        keep = set(m["keep"])
        os.makedirs(dest_dir, exist_ok=True)
        out = os.path.join(dest_dir, os.path.basename(src))
        record_name = next(n for n in names if n.endswith(".dist-info/RECORD"))
        lines = []
        with zipfile.ZipFile(out + ".tmp", "w", zipfile.ZIP_DEFLATED, compresslevel=level) as zout:
            for item in zin.infolist():
                if item.filename not in keep:
                    continue
                data = zin.read(item.filename)
                zout.writestr(item, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=level)
                lines.append(_record_line(item.filename, data))
            lines.append(f"{record_name},,")
            zout.writestr(record_name, "\n".join(lines) + "\n")
        os.replace(out + ".tmp", out)
    m.update(wheel=out, before_mib=os.path.getsize(src) / 2**20, after_mib=os.path.getsize(out) / 2**20,
             files=len(keep))
    return m


def fetch(cache: str = CACHE) -> str:
    """The PyPI wheel, from ``cache`` or downloaded into it (pip, network)."""
    path = os.path.join(cache, WHEEL)
    if not os.path.exists(path):
        from devenv.sglang_wheels import download

        os.makedirs(cache, exist_ok=True)
        download([f"flashinfer-python=={VERSION}"], cache)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devenv.flashinfer_wheel")
    ap.add_argument("dest", help="folder for the trimmed wheel and its carried requirements (e.g. .whl-fi)")
    ap.add_argument("--no-deps", action="store_true", help="the FlashInfer wheel only")
    a = ap.parse_args(argv)
    m = trim(fetch(), a.dest)
    if not a.no_deps:
        from devenv.sglang_wheels import download

        download(CARRIED_DEPS, a.dest)
    total = sum(os.path.getsize(os.path.join(a.dest, f)) for f in os.listdir(a.dest))
    print(f"flashinfer {VERSION}: {m['before_mib']:.1f} MiB -> {m['after_mib']:.1f} MiB trimmed "
          f"({m['files']} files, {len(m['sources'])} JIT sources, {m['headers']} headers); "
          f"{len(os.listdir(a.dest))} wheels, {total / 2**20:.1f} MiB in {a.dest}")
    if m["missing_sources"]:
        print(f"JIT sources not in the wheel: {m['missing_sources']}", file=sys.stderr)
        return 1
    if m["unknown_computed"]:
        print(f"computed includes the scan cannot expand (add them to MACRO_INCLUDES): {m['unknown_computed']}",
              file=sys.stderr)
        return 1
    if m["after_mib"] > LIMIT_MIB:
        print(f"trimmed wheel over its {LIMIT_MIB} MiB budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

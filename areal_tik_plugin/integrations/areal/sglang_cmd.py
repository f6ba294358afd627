"""The SGLang server command the plugin starts (single-controller mode: in AReaL's rollout worker;
SPMD mode: :func:`start_server` from the launcher or a test).

AReaL 1.0.4 builds ``python3 -m areal.experimental.inference_service.sglang.launch_server`` with
arguments for SGLang 0.5.10; with the installed SGLang (0.5.23) its wrapper breaks
(``run_scheduler_process`` changed) and five of its keys are unknown. The plugin instead runs
``python -m sglang.launch_server`` (the ``tik`` plugin is loaded by SGLang's ``sglang.srt.plugins``
entry point in every SGLang process) -- or, for an SGLang without a plugin system,
``python -m areal_tik_plugin.integrations.sglang.launch`` -- and passes only the arguments the
installed ``ServerArgs`` knows. Plugin on: ``--attention-backend tik``.

On CUDA without a real ``sgl_kernel`` (the GPU box: ``devenv/gpu_stubs/sgl_kernel`` stands in,
raising on any call) the command is set up as ``sglang_gpu_proof`` runs its engines: sampling
``pytorch`` and grammar ``none`` (their defaults need flashinfer / xgrammar kernels); plugin off
(baseline), AReaL's ``fa3`` (sgl-kernel's FlashAttention) becomes ``triton`` and SGLang's fused
layer ops run their torch-native paths (``SGLANG_FORCE_FUSED_OP_BACKEND=torch``, plugins off).
Decode CUDA graphs are captured up to ``max_running_requests`` only.
"""

from __future__ import annotations

import os
import sys
import time

from .config import TikConfig

# accelerator-only backends replaced on CPU (baseline runs)
_GPU_ATTENTION = ("fa3", "fa4", "flashinfer", "triton", "flashmla", "cutlass_mla", "trtllm_mha", "trtllm_mla")
CPU_DEFAULTS = {
    "sampling_backend": "pytorch", "grammar_backend": "none", "disable_cuda_graph": True,
    "skip_server_warmup": True, "sleep_on_idle": True, "max_total_tokens": 4096,
    # a fraction of *host* RAM on CPU; SGLang refuses to start when 1 - free/total exceeds it, so
    # 0.05 fails on a busy machine. The KV pool stays capped by max_total_tokens.
    "mem_fraction_static": 0.4,
}
# stock attention backends that call sgl-kernel / flashinfer / trtllm kernels on CUDA; without a real
# sgl_kernel the baseline server uses SGLang's Triton backend instead (as sglang_gpu_proof measured)
_NEEDS_SGL_KERNEL = ("fa3", "fa4", "flashinfer", "flashmla", "cutlass_mla", "trtllm_mha", "trtllm_mla")
STOCK_CUDA_ATTENTION = "triton"
# environment the GPU proof runs SGLang with when sgl_kernel is the stub (setdefault: the caller wins)
STUB_SGL_KERNEL_ENV = {
    "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
    # the trimmed wheel's Rust radix TreeCore fails against torch 2.11: SGLang's Python TreeCore
    "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "python",
}


def server_fields() -> set[str]:
    from sglang.srt.server_args import ServerArgs

    f = getattr(ServerArgs, "__struct_fields__", None)
    return set(f) if f else set(getattr(ServerArgs, "__dataclass_fields__", {}))


def has_plugin_system() -> bool:
    import importlib.util

    return importlib.util.find_spec("sglang.srt.plugins") is not None


def resolve_device(tik: TikConfig) -> str:
    if tik.sglang_device != "auto":
        return tik.sglang_device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def has_flashinfer() -> bool:
    """FlashInfer importable (on the GPU box: the carried trimmed wheel, devenv/flashinfer_wheel.py)."""
    import importlib.util

    return importlib.util.find_spec("flashinfer") is not None


def real_sgl_kernel() -> bool:
    """True when an installed ``sgl_kernel`` (SGLang's CUDA kernel wheel) is importable; False when it
    is absent or is the plugin's import-only stand-in (``devenv/gpu_stubs/sgl_kernel``)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("sgl_kernel")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin:
        return False
    from areal_tik_plugin.runtime.source_checkout import devenv_dir

    stubs = devenv_dir("gpu_stubs")
    return stubs is None or not os.path.abspath(spec.origin).startswith(stubs + os.sep)


def to_flags(args: dict) -> list[str]:
    out = []
    for k, v in args.items():
        if v is None or v is False or v == "" or (isinstance(v, (list, tuple)) and not v):
            continue
        flag = "--" + k.replace("_", "-")
        if v is True:
            out.append(flag)
        elif isinstance(v, (list, tuple)):
            out += [flag, *map(str, v)]
        else:
            out += [flag, str(v)]
    return out


def build_command(server_args: dict, tik: TikConfig, python: str | None = None) -> tuple[list[str], dict]:
    """AReaL's SGLang ``server_args`` dict -> (argv, env) for the installed SGLang."""
    args = dict(server_args)
    device = resolve_device(tik)
    args["device"] = device
    if tik.enable:
        args["attention_backend"] = tik.sglang_attention_backend
    elif device == "cpu" and (args.get("attention_backend") in _GPU_ATTENTION or not args.get("attention_backend")):
        args["attention_backend"] = "torch_native"
    if device == "cpu":
        for k, v in CPU_DEFAULTS.items():
            if k in ("mem_fraction_static",) or args.get(k) in (None, False, ""):
                args[k] = v
        if args.get("max_running_requests") in (None, 0):
            args["max_running_requests"] = 16
    env = os.environ.copy()
    known = server_fields()
    if device == "cuda":
        if args.get("max_running_requests") and "cuda_graph_max_bs_decode" in known and \
                args.get("cuda_graph_max_bs_decode") is None and "--cuda-graph-max-bs-decode" not in tik.sglang_extra_args:
            args["cuda_graph_max_bs_decode"] = args["max_running_requests"]  # no graphs for batches never run
        if not real_sgl_kernel():
            for k, v in (("sampling_backend", "pytorch"), ("grammar_backend", "none")):
                if args.get(k) in (None, ""):
                    args[k] = v
            for k, v in STUB_SGL_KERNEL_ENV.items():
                env.setdefault(k, v)
            if not tik.enable and has_flashinfer():
                # the stack a user runs: FlashInfer attention, the fused ops sgl-kernel ships served by
                # FlashInfer through the stub's FlashInfer mode (devenv/gpu_stubs/sgl_kernel)
                if args.get("attention_backend") in _NEEDS_SGL_KERNEL or not args.get("attention_backend"):
                    print(f"[tik] SGLang (baseline, sgl-kernel served by FlashInfer): attention backend "
                          f"{args.get('attention_backend')!r} -> 'flashinfer'", flush=True)
                    args["attention_backend"] = "flashinfer"
                env.setdefault("TIK_SGL_KERNEL_SHIM", "flashinfer")
                env.setdefault("SGLANG_PLUGINS", "none")
            elif not tik.enable:
                if args.get("attention_backend") in _NEEDS_SGL_KERNEL or not args.get("attention_backend"):
                    print(f"[tik] SGLang (baseline, no sgl-kernel, no FlashInfer): attention backend "
                          f"{args.get('attention_backend')!r} -> {STOCK_CUDA_ATTENTION!r}; torch-native layer ops", flush=True)
                    args["attention_backend"] = STOCK_CUDA_ATTENTION
                env.setdefault("SGLANG_FORCE_FUSED_OP_BACKEND", "torch")
                env.setdefault("SGLANG_PLUGINS", "none")
    if tik.enable:
        env.setdefault("SGLANG_PLUGINS", "tik")
    dropped = sorted(k for k in args if k not in known)
    args = {k: v for k, v in args.items() if k in known}
    module = "sglang.launch_server" if has_plugin_system() else "areal_tik_plugin.integrations.sglang.launch"
    cmd = [python or sys.executable, "-m", module, *to_flags(args), *tik.sglang_extra_args]
    if device == "cpu":  # the Triton kernels run under the interpreter; set before triton imports
        env.setdefault("TRITON_INTERPRET", "1")
    if dropped:
        print(f"[tik] SGLang: dropped arguments unknown to the installed version: {dropped}", flush=True)
    return cmd, env


def server_args_from_areal(cfg, tp_size: int = 1, host: str = "127.0.0.1", port: int = 30000) -> dict:
    """SGLang arguments exactly as AReaL builds them for its own launcher (``SGLangConfig.build_args``)."""
    import copy

    from areal.api.cli_args import SGLangConfig

    sg = copy.deepcopy(cfg.sglang)
    if not sg.model_path:  # configs without an sglang section (AReaL's CPU example)
        sg.model_path = cfg.actor.path
    return SGLangConfig.build_args(sglang_config=sg, tp_size=tp_size, base_gpu_id=0, host=host, port=port)


def is_healthy(host: str, port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001 -- not up yet
        return False


def wait_healthy(host: str, port: int, proc=None, timeout: float = 300.0) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"SGLang server exited with code {proc.returncode} before becoming healthy")
        if is_healthy(host, port):
            return
        time.sleep(0.5)
    raise TimeoutError(f"SGLang server at {host}:{port} not healthy after {timeout:.0f}s")


class PortInUse(RuntimeError):
    """The server exited because its port was taken before it could bind it."""


def _log_says_port_in_use(log_path: str | None, since: int) -> bool:
    if not log_path or not os.path.exists(log_path):
        return False
    with open(log_path, "rb") as f:
        f.seek(since)
        return b"address already in use" in f.read().lower()


def start_server_on_free_port(make_args, free_port, tik: TikConfig, tries: int = 3, **kw):
    """:func:`start_server` (``wait`` True) on ``make_args(free_port())``; where the server exits because another
    process bound that port between ``free_port()`` and the server's own bind (a free port is not held), again on
    a fresh one, up to ``tries`` ports. Returns (process, port)."""
    for attempt in range(tries):
        port = free_port()
        try:
            return start_server(make_args(port), tik, **kw), port
        except PortInUse:
            if attempt == tries - 1:
                raise


def start_server(server_args: dict, tik: TikConfig, log_path: str | None = None, timeout: float = 300.0,
                 extra_env: dict | None = None, wait: bool = True):
    """Start SGLang with :func:`build_command` in its own process group and (``wait``) wait until
    healthy. ``extra_env`` (e.g. ``CUDA_VISIBLE_DEVICES``) overrides the environment."""
    import subprocess

    cmd, env = build_command(server_args, tik)
    env.update(extra_env or {})
    if log_path:
        with open(log_path, "a") as f:
            f.write("[tik] " + " ".join(cmd) + "\n" + "".join(
                f"[tik]   {k}={env[k]}\n" for k in sorted(env) if k.startswith(("SGLANG_", "CUDA_VISIBLE"))))
    since = os.path.getsize(log_path) if log_path else 0
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    if wait:
        try:
            wait_healthy(server_args.get("host", "127.0.0.1"), int(server_args["port"]), proc, timeout)
        except RuntimeError as e:
            stop_server(proc)
            if proc.poll() is not None and _log_says_port_in_use(log_path, since):
                raise PortInUse(f"SGLang could not bind port {server_args['port']} (address already in use; "
                                f"log {log_path})") from e
            raise
        except BaseException:
            stop_server(proc)
            raise
    return proc


def stop_server(proc, timeout: float = 20.0) -> None:
    import signal

    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)
    except Exception:  # noqa: BLE001 -- escalate
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

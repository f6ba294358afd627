"""The SGLang server command the plugin starts (single-controller mode: in AReaL's rollout worker;
SPMD mode: :func:`start_server` from the launcher or a test).

AReaL 1.0.4 builds ``python3 -m areal.experimental.inference_service.sglang.launch_server`` with
arguments for SGLang 0.5.10; with the installed SGLang (0.5.23) its wrapper breaks
(``run_scheduler_process`` changed) and five of its keys are unknown. The plugin instead runs
``python -m sglang.launch_server`` (the ``tik`` plugin is loaded by SGLang's ``sglang.srt.plugins``
entry point in every SGLang process) -- or, for an SGLang without a plugin system,
``python -m areal_tik_plugin.integrations.sglang_launch`` -- and passes only the arguments the
installed ``ServerArgs`` knows. Plugin on: ``--attention-backend tik``.
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
    known = server_fields()
    dropped = sorted(k for k in args if k not in known)
    args = {k: v for k, v in args.items() if k in known}
    module = "sglang.launch_server" if has_plugin_system() else "areal_tik_plugin.integrations.sglang_launch"
    cmd = [python or sys.executable, "-m", module, *to_flags(args), *tik.sglang_extra_args]
    env = os.environ.copy()
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


def wait_healthy(host: str, port: int, proc=None, timeout: float = 300.0) -> None:
    import urllib.request

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"SGLang server exited with code {proc.returncode} before becoming healthy")
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:  # noqa: BLE001 -- not up yet
            pass
        time.sleep(0.5)
    raise TimeoutError(f"SGLang server at {host}:{port} not healthy after {timeout:.0f}s")


def start_server(server_args: dict, tik: TikConfig, log_path: str | None = None, timeout: float = 300.0):
    """Start SGLang with :func:`build_command` in its own process group and wait until healthy."""
    import subprocess

    cmd, env = build_command(server_args, tik)
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(server_args.get("host", "127.0.0.1"), int(server_args["port"]), proc, timeout)
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

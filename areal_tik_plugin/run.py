"""Run an existing AReaL entry script with the plugin: the one documented change.

Single-controller mode (AReaL starts workers and SGLang)::

    python -m areal_tik_plugin.run examples/math/gsm8k_rl.py --config my.yaml scheduler.type=local [tik.*=...]

SPMD mode, servers started by the plugin (``--spmd``: SGLang with the plugin, then torchrun)::

    python -m areal_tik_plugin.run --spmd examples/math/gsm8k_rl.py --config my.yaml [tik.*=...]

SPMD mode under your own torchrun, SGLang servers given in ``AREAL_LLM_SERVER_ADDRS``::

    AREAL_SPMD_MODE=1 torchrun ... -m areal_tik_plugin.run examples/math/gsm8k_rl.py --config my.yaml

``tik.*`` overrides (see :class:`areal_tik_plugin.integrations.areal.config.TikConfig`) are taken
off the command line before AReaL sees it; ``tik.enable=false`` runs stock AReaL with the plugin's
throughput / stats logging (the baseline of ``tik compare``). The entry script is not modified:
its ``load_expr_config`` returns the config with the plan applied (recompute off etc.).
"""

from __future__ import annotations

import os
import runpy
import sys


_CTX: dict = {"cli": [], "sections": {}}


def _install_section_hook() -> None:
    """AReaL rejects unknown top-level keys: take the ``tik:``/``recipe:`` sections off the composed
    config before it is merged into AReaL's dataclass (``to_structured_cfg``)."""
    import areal.api.cli_args as CA

    from areal_tik_plugin.integrations.areal import config as C

    if getattr(CA.to_structured_cfg, "_tik", False):
        return
    orig = CA.to_structured_cfg

    def to_structured_cfg(cfg, config_cls):
        if hasattr(cfg, "keys") and config_cls is not None and "actor" in getattr(config_cls, "__dataclass_fields__", {}):
            _CTX["sections"].update(C.strip_plugin_sections(cfg))
        return orig(cfg, config_cls)

    to_structured_cfg._tik = True
    CA.to_structured_cfg = to_structured_cfg


def resolved_tik():
    from areal_tik_plugin.integrations.areal.config import TikConfig, check_section

    return TikConfig.from_overrides(_CTX["cli"], check_section(_CTX["sections"].get("tik") or {}))


def _install_config_hook() -> None:
    import areal.api.cli_args as CA

    from areal_tik_plugin.integrations.areal import ENV_VAR
    from areal_tik_plugin.integrations.areal import config as C
    from areal_tik_plugin.integrations.areal import hooks as H

    _install_section_hook()
    orig = CA.load_expr_config

    def load_expr_config(argv, config_cls):
        cfg, path = orig(argv, config_cls)
        tik = resolved_tik()
        os.environ[ENV_VAR] = tik.to_env()
        p = C.plan(cfg, tik)
        C.apply(cfg, p, tik)
        print(p.describe(), flush=True)
        from areal.utils.environ import is_single_controller

        if not is_single_controller():
            H.install_worker(tik, p)  # SPMD: this process holds the engines
        H.install_controller(tik, p, {"entry": sys.argv[0], "recipe": _CTX["sections"].get("recipe")})
        if os.getenv("RANK", "0") == "0":
            from areal.utils.stats_logger import StatsLogger

            CA.save_config(cfg, StatsLogger.get_log_path(cfg.stats_logger))
        return cfg, path

    CA.load_expr_config = load_expr_config
    H.replace_everywhere(orig, load_expr_config)


def run_entry(entry: list[str]) -> None:
    """Run ``entry`` (``script.py args...`` or ``-m module args...``) in this process."""
    _install_config_hook()
    if entry[0] == "-m":
        sys.argv = [entry[1], *entry[2:]]
        runpy.run_module(entry[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(entry)
        sys.path.insert(0, os.path.dirname(os.path.abspath(entry[0])))
        runpy.run_path(entry[0], run_name="__main__")


def assign_gpus(n_servers: int, gpus_per_server: int, n_trainer: int, visible: list[str] | None = None):
    """Disjoint GPUs for the SGLang servers and the trainer, as AReaL's schedulers place them.

    -> (one ``CUDA_VISIBLE_DEVICES`` value per server, the trainer's value), or ``None`` where the
    machine has too few GPUs (or none): then every process inherits the environment (colocated).
    ``visible``: the usable GPU ids (default: ``CUDA_VISIBLE_DEVICES`` or all devices)."""
    if visible is None:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
        if cvd is not None:
            visible = [x.strip() for x in cvd.split(",") if x.strip()]
        else:
            import torch

            visible = [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    need = n_servers * gpus_per_server + n_trainer
    if not visible or len(visible) < need:
        if visible:
            print(f"[tik] {len(visible)} GPU(s) for {need} (SGLang {n_servers}x{gpus_per_server} + trainer "
                  f"{n_trainer}): processes share GPUs", flush=True)
        return None
    servers = [",".join(visible[i * gpus_per_server:(i + 1) * gpus_per_server]) for i in range(n_servers)]
    k = n_servers * gpus_per_server
    return servers, ",".join(visible[k:k + n_trainer])


def launch_spmd(entry: list[str], nproc: int | None, port: int | None, log_dir: str | None) -> int:
    """Start SGLang (plugin per ``tik``) for the config, then torchrun this module on ``entry``.

    With enough GPUs the servers and the trainer get disjoint ones (``CUDA_VISIBLE_DEVICES``) and the
    trainer starts while SGLang loads (AReaL waits for the servers' health itself); otherwise the
    trainer starts once every server is healthy."""
    import socket
    import subprocess

    from areal.api.cli_args import GRPOConfig, parse_cli_args
    from omegaconf import OmegaConf

    from areal_tik_plugin.integrations.areal import ENV_VAR
    from areal_tik_plugin.integrations.areal import config as C
    from areal_tik_plugin.integrations.areal import sglang_cmd as S

    _install_section_hook()
    args = entry[1:] if entry[0] != "-m" else entry[2:]
    import areal.api.cli_args as CA

    cfg = OmegaConf.to_object(CA.to_structured_cfg(parse_cli_args(args)[0], GRPOConfig))
    tik = resolved_tik()
    p = C.plan(cfg, tik)
    C.apply(cfg, p, tik)
    _, rdims = C.parse_backend(cfg.rollout.backend)
    _, adims = C.parse_backend(cfg.actor.backend)

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    import signal
    import time

    def _term(signum, frame):  # run the finally below (stop the servers) on SIGTERM too
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _term)
    n_srv, tp = rdims.get("d", 1), rdims.get("t", 1)
    n = nproc or adims.get("d", 1) * adims.get("p", 1) * adims.get("t", 1)
    gpus = assign_gpus(n_srv, tp, n) if S.resolve_device(tik) == "cuda" else None  # None: sequential start
    servers, addrs, trainer = [], [], None
    try:
        for i in range(n_srv):
            log = os.path.join(log_dir, f"sglang_{i}.log") if log_dir else None
            extra = {"CUDA_VISIBLE_DEVICES": gpus[0][i]} if gpus else None

            def args_for(sp):
                return S.server_args_from_areal(cfg, tp_size=tp, host="127.0.0.1", port=sp)

            if port or gpus:
                sp = port + i if port else free_port()
                proc = S.start_server(args_for(sp), tik, log_path=log, extra_env=extra, wait=gpus is None)
            else:  # started one by one and waited for: a port taken before the server bound it is retried
                proc, sp = S.start_server_on_free_port(args_for, free_port, tik, log_path=log, extra_env=extra)
            servers.append((proc, sp))
            addrs.append(f"127.0.0.1:{sp}")
        env = dict(os.environ, AREAL_SPMD_MODE="1", AREAL_LLM_SERVER_ADDRS=",".join(addrs))
        env[ENV_VAR] = tik.to_env()
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = gpus[1]
            print(f"[tik] GPUs: SGLang {gpus[0]}, trainer {gpus[1]}", flush=True)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(n),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "areal_tik_plugin.run",
               *entry, *_CTX["cli"]]
        trainer = subprocess.Popen(cmd, env=env, start_new_session=True)
        t0, pending = time.time(), list(servers) if gpus else []
        while trainer.poll() is None:  # a server that dies (or, still loading, never gets healthy) ends the run
            dead = [sp for proc, sp in servers if proc.poll() is not None]
            if dead:
                print(f"[tik] SGLang server(s) on port(s) {dead} exited; stopping the trainer", flush=True)
                return 1
            if pending:
                pending = [(proc, sp) for proc, sp in pending if not S.is_healthy("127.0.0.1", sp)]
                if not pending:
                    print(f"[tik] SGLang healthy after {time.time() - t0:.0f} s (trainer started alongside)", flush=True)
                elif time.time() - t0 > 300.0:
                    print("[tik] SGLang not healthy after 300 s; stopping", flush=True)
                    return 1
            time.sleep(1.0)
        return trainer.returncode
    finally:
        if trainer is not None and trainer.poll() is None:  # interrupted: take torchrun's group down
            S.stop_server(trainer)
        for proc, _ in servers:
            S.stop_server(proc)


def main(argv: list[str] | None = None) -> int:
    from areal_tik_plugin.integrations.areal.config import TikConfig, split_tik_overrides

    argv = list(sys.argv[1:] if argv is None else argv)
    spmd, nproc, port, log_dir = False, None, None, None
    while argv and argv[0].startswith("--") and argv[0] != "--config":
        flag = argv.pop(0)
        if flag == "--spmd":
            spmd = True
        elif flag == "--nproc":
            nproc = int(argv.pop(0))
        elif flag == "--sglang-port":
            port = int(argv.pop(0))
        elif flag == "--log-dir":
            log_dir = argv.pop(0)
        else:
            print(f"unknown option {flag}\n{__doc__}", file=sys.stderr)
            return 2
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():  # CPU: Triton kernels under the interpreter (before triton imports)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    tik_ov, entry = split_tik_overrides(argv)
    TikConfig.from_overrides(tik_ov)  # fail fast on a bad override
    _CTX["cli"] = tik_ov
    from areal_tik_plugin.integrations.areal.env import cpu_stub_paths

    for pth in cpu_stub_paths():  # CPU test machines only (real packages absent)
        if pth not in sys.path:
            sys.path.insert(0, pth)
            os.environ["PYTHONPATH"] = os.pathsep.join([pth, *[x for x in os.environ.get("PYTHONPATH", "").split(os.pathsep) if x]])
    if spmd:
        return launch_spmd(entry, nproc, port, log_dir)
    run_entry(entry)
    return 0


if __name__ == "__main__":
    sys.exit(main())

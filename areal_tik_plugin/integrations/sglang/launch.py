"""Launcher for SGLang versions without the plugin system (e.g. 0.5.10.post1, pinned by AReaL 1.0.4).

    python -m areal_tik_plugin.integrations.sglang.launch --model-path M --attention-backend tik ...
    python -m areal_tik_plugin.integrations.sglang.launch --tik-module some.other.entry -- ARGS...

It registers the plugin (attention backend, CLI choices, layer-op hooks) in this process (the HTTP /
engine process), then makes every process SGLang spawns register it too: SGLang starts its
scheduler and DP-controller processes with the ``spawn`` method, so patches made here are lost
there. The launcher swaps SGLang's process targets (``run_scheduler_process``,
``run_data_parallel_controller_process``, and the ``Engine.run_scheduler_process_func`` class
attribute of newer versions) for module-level wrappers of this module; a spawned child unpickles
them by reference, which imports this module (registering the plugin in the child) before SGLang's
own target runs. Then it runs the target entry module (default ``sglang.launch_server``) as
``__main__`` with the remaining arguments.

On SGLang with ``sglang.srt.plugins`` the entry point already does all this; the launcher is then
harmless (registration is idempotent).
"""

from __future__ import annotations

import logging
import runpy
import sys

from areal_tik_plugin.integrations.sglang import plugin as sglang_plugin

logger = logging.getLogger(__name__)

DEFAULT_TARGET = "sglang.launch_server"
_STATE = {"installed": False}


def _originals():
    from sglang.srt.managers import scheduler

    orig = {"scheduler": getattr(scheduler, "run_scheduler_process", None)}
    try:
        from sglang.srt.managers import data_parallel_controller as dpc

        orig["dp"] = getattr(dpc, "run_data_parallel_controller_process", None)
    except ImportError:
        orig["dp"] = None
    return orig


_ORIG: dict = {}


def run_scheduler_process(*args, **kwargs):
    """Spawn target: register the plugin in this (scheduler) process, then run SGLang's scheduler."""
    install()
    return _ORIG["scheduler"](*args, **kwargs)


def run_data_parallel_controller_process(*args, **kwargs):
    """Spawn target: register in the DP controller (it spawns the schedulers), then run it."""
    install()
    return _ORIG["dp"](*args, **kwargs)


def _swap(module_attr_owner, name, original, wrapper):
    import types

    if original is None:
        return
    setattr(module_attr_owner, name, wrapper)
    for mod in list(sys.modules.values()):  # stale `from X import name` bindings
        if isinstance(mod, types.ModuleType) and mod is not module_attr_owner:
            for k, v in list(vars(mod).items()):
                if v is original:
                    setattr(mod, k, wrapper)


def install() -> None:
    """Register the plugin here and route SGLang's spawn targets through this module (idempotent)."""
    sglang_plugin.register(apply_now=True)
    if _STATE["installed"]:
        return
    _ORIG.update({k: v for k, v in _originals().items() if k not in _ORIG})
    from sglang.srt.managers import scheduler

    _swap(scheduler, "run_scheduler_process", _ORIG["scheduler"], run_scheduler_process)
    if _ORIG.get("dp") is not None:
        from sglang.srt.managers import data_parallel_controller as dpc

        _swap(dpc, "run_data_parallel_controller_process", _ORIG["dp"], run_data_parallel_controller_process)
    try:  # newer SGLang keeps the target as an Engine class attribute
        from sglang.srt.entrypoints.engine import Engine

        if "run_scheduler_process_func" in Engine.__dict__:
            Engine.run_scheduler_process_func = staticmethod(run_scheduler_process)
    except ImportError:
        pass
    _STATE["installed"] = True


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    target = DEFAULT_TARGET
    if argv[:1] == ["--tik-module"]:
        if len(argv) < 2:
            print("usage: sglang_launch [--tik-module MODULE [--]] ARGS...", file=sys.stderr)
            return 2
        target, argv = argv[1], argv[2:]
        if argv[:1] == ["--"]:
            argv = argv[1:]
    install()
    sys.argv = [target] + argv
    runpy.run_module(target, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    # run through the module's import name, so the spawn targets pickle as
    # areal_tik_plugin.integrations.sglang.launch.* (not __main__.*, which runpy replaces)
    from areal_tik_plugin.integrations.sglang.launch import main as _main

    sys.exit(_main())

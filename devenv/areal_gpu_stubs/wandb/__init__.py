"""Import-only stand-in for ``wandb`` on the GPU machine, for runs whose W&B logging is disabled.

Why: the wandb 0.31.0 wheel is 20 MiB (mostly its Go ``wandb-core`` service), a third of the device's
64 MiB carry, and a run with ``stats_logger.wandb.mode=disabled`` logs nothing to W&B anyway: the
metrics that ``tik compare`` reads go to the plugin's local ``tik_stats.jsonl``.

What AReaL 1.0.4 needs from it: ``areal.utils.stats_logger`` imports wandb at module level (every
trainer imports that), calls ``wandb.login()`` only when the mode is not ``disabled``, then always
``wandb.init(mode=...)``, ``wandb.log(item, step=...)`` per committed step and ``wandb.finish()``;
``areal.utils.logging.log_swanlab_wandb_tensorboard`` calls ``wandb.log`` too.

Here ``init`` accepts only the disabled mode (the ``mode`` argument, else ``WANDB_MODE``, as wandb
resolves it) and returns a run that records nothing, as wandb's own disabled run does; ``log`` and
``finish`` are no-ops after it. Everything that would log for real -- ``init`` in any other mode,
``login``, ``log`` before ``init``, any other attribute, any ``wandb.*`` submodule -- raises an error
that names the missing package. The GPU step scripts put this folder on PYTHONPATH after /tmp/site,
where the carried wheels install, so a carried wandb wins; the H200 image has none of its own.
"""

import importlib.abc
import os
import sys

__version__ = "0.0.0+tik-stub"

_WHY = ("wandb is not installed here (import-only stand-in from devenv/areal_gpu_stubs, for "
        "stats_logger.wandb.mode=disabled); carry the wandb wheel to log to W&B")


class _DisabledRun:
    """What ``wandb.init(mode="disabled")`` returns: a run that records nothing."""

    disabled = True

    def __init__(self, kwargs: dict):
        self.id = kwargs.get("id")
        self.name = kwargs.get("name")
        self.project = kwargs.get("project")
        self.group = kwargs.get("group")
        self.dir = kwargs.get("dir")

    def log(self, data, step=None, commit=None):
        log(data, step=step, commit=commit)

    def finish(self, exit_code=None, quiet=None):
        finish(exit_code=exit_code, quiet=quiet)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        finish()
        return False


run = None


def init(*args, mode=None, **kwargs):
    global run
    if args:
        raise TypeError(f"wandb.init takes keyword arguments only (stand-in), got {len(args)} positional")
    effective = mode if mode is not None else os.environ.get("WANDB_MODE")
    if effective != "disabled":
        raise RuntimeError(f"wandb.init(mode={effective!r}): {_WHY}")
    run = _DisabledRun(kwargs)
    return run


def log(data, step=None, commit=None, **kwargs):
    if run is None:
        raise RuntimeError(f"wandb.log before wandb.init(mode='disabled'): {_WHY}")
    if not isinstance(data, dict):
        raise TypeError(f"wandb.log expects a dict of metrics, got {type(data).__name__}")


def finish(exit_code=None, quiet=None):
    global run
    run = None


def login(*args, **kwargs):
    raise RuntimeError(f"wandb.login: {_WHY}")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(f"wandb.{name}: {_WHY}")


class _NoSubmodules(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("wandb."):
            raise ModuleNotFoundError(f"{fullname}: {_WHY}", name=fullname)
        return None


sys.meta_path.insert(0, _NoSubmodules())

"""Import-only stand-in for ``ray`` on the GPU machine (no ray wheel: ~70 MB, over the carry budget).

AReaL 1.0.4 imports ray and some submodules at module level (launcher, scheduler, name_resolve,
rtensor, remote_inf_engine) even when no Ray scheduler is used; the FSDP engine driven directly
(``recipes/bench_recompute.py``) never calls it. Here ``ray.is_initialized()`` is False, ``@ray.remote``
leaves the decorated object as it is, ``isinstance(x, ray.ObjectRef)`` is False, any ``ray.*`` submodule
imports as a stub, and every other name in them is a placeholder class whose use (a call, an instance)
raises an error naming it -- never a silent fallback. Put on PYTHONPATH only where ray is absent.
"""

import importlib.abc
import importlib.machinery
import sys
import types


def _placeholder(qualname: str):
    def _fail(*args, **kwargs):
        raise RuntimeError(f"{qualname}: ray is not installed here (import-only stub from areal_tik_plugin)")

    return type(qualname.rsplit(".", 1)[-1], (Exception,), {"__init__": _fail, "__call__": _fail,
                                                             "__module__": qualname.rsplit(".", 1)[0]})


class ObjectRef:  # nothing is an instance
    pass


def is_initialized() -> bool:
    return False


def remote(*args, **kwargs):
    if len(args) == 1 and not kwargs and callable(args[0]):
        return args[0]
    return lambda obj: obj


_SUBMODULES = {"actor", "util", "exceptions", "runtime_env", "cloudpickle", "internal"}


def _module_getattr(modname):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        if modname == "ray" and name in _SUBMODULES:  # attribute access to a submodule (ray.actor.ActorHandle)
            import importlib

            return importlib.import_module(f"{modname}.{name}")
        return _placeholder(f"{modname}.{name}")

    return __getattr__


__getattr__ = _module_getattr("ray")


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("ray."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = _module_getattr(spec.name)
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.append(_SubmoduleFinder())

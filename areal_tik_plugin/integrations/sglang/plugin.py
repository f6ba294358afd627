"""SGLang plugin entry point (``sglang.srt.plugins`` group, name ``tik``; see pyproject.toml).

SGLang >= 0.5.2x calls :func:`load` in every process it starts (engine / HTTP server, each scheduler,
the detokenizer, the DP controller) before it builds ``ServerArgs``. :func:`load` only *registers*:

* the ``tik`` attention backend in SGLang's attention registry, and ``tik`` in the CLI choices
  (``--attention-backend``, the deterministic-inference list and the radix-cache-compatible
  deterministic list);
* HookRegistry hooks for the layer ops of :mod:`areal_tik_plugin.integrations.sglang.layers`
  (pass-through until activated).

Nothing changes numerically unless a server is started with ``--attention-backend tik``: building
that backend in a scheduler process activates the layer-op routing for its model. Restrict which
plugins SGLang loads with ``SGLANG_PLUGINS=tik``. For SGLang without the plugin system (e.g. 0.5.10,
pinned by AReaL 1.0.4) use ``python -m areal_tik_plugin.integrations.sglang.launch``.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)

BACKEND_NAME = "tik"
_REGISTERED = {"done": False}


def load() -> None:
    """Entry point for ``sglang.srt.plugins`` (idempotent)."""
    register()


def register(apply_now: bool = False) -> None:
    """Register the ``tik`` backend + choices and the layer-op hooks in this process (idempotent).

    ``apply_now``: apply the HookRegistry hooks immediately (the launcher path; SGLang's
    ``load_plugins`` applies them itself after running every plugin).
    """
    if _REGISTERED["done"]:
        if apply_now:
            _apply_hooks()
        return
    from areal_tik_plugin import versions
    from areal_tik_plugin.runtime.interp import ensure_interpreter_if_no_gpu

    versions.sglang_mode()  # refuses an SGLang the plugin is not tested with, naming the ones it is
    # Without a GPU, SGLang 0.5.10 still runs its own Triton kernels (e.g. the req-to-token writes; it
    # decides by backend name, not by platform): they run in Triton's interpreter, which needs the same
    # fixes as ours (areal_tik_plugin.runtime.interp), applied here in every SGLang process.
    ensure_interpreter_if_no_gpu()
    _register_backend()
    _register_hooks()
    _REGISTERED["done"] = True
    if apply_now:
        _apply_hooks()


def _register_backend() -> None:
    from sglang.srt.layers.attention import attention_registry as R

    from areal_tik_plugin.integrations.sglang.backend import create_tik_backend

    if BACKEND_NAME not in R.ATTENTION_BACKENDS:
        R.register_attention_backend(BACKEND_NAME)(create_tik_backend)
    try:
        from sglang.srt.arg_groups import choices as C
    except ImportError:  # older SGLang keeps the lists in server_args
        from sglang.srt import server_args as C
    for list_name, adder in (
        ("ATTENTION_BACKEND_CHOICES", "add_attention_backend_choices"),
        ("DETERMINISTIC_ATTENTION_BACKEND_CHOICES", "add_deterministic_attention_backend_choices"),
        ("RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND", "add_radix_supported_deterministic_attention_backend_choices"),
    ):
        lst = getattr(C, list_name, None)
        if lst is None or BACKEND_NAME in lst:
            continue
        add = getattr(C, adder, None)
        (add or lst.extend)([BACKEND_NAME])


def _hook_registry():
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:
        return None, None
    return HookRegistry, HookType


def _register_hooks() -> None:
    from areal_tik_plugin.integrations.sglang import layers as L

    HookRegistry, HookType = _hook_registry()
    kinds = {}
    if HookRegistry is not None:
        kinds = {"around": HookType.AROUND, "replace": HookType.REPLACE}
    targets = dict(L.FUNCTION_HOOKS)
    try:  # BaseFusedOp (SGLang >= 0.5.2x): give each op class a forward_plugin
        import sglang.kernels.fused_op  # noqa: F401

        for cls_path, fn in L.FUSED_OP_FORWARDS.items():
            targets[cls_path + ".forward_plugin"] = (fn, "replace")
    except ImportError:
        pass
    for target, (fn, kind) in targets.items():
        if HookRegistry is not None:
            HookRegistry.register(target, fn, kinds[kind])
        else:
            _PENDING.append((target, fn, kind))


_PENDING: list = []
_PATCHED: set = set()


def _apply_hooks() -> None:
    HookRegistry, _ = _hook_registry()
    if HookRegistry is not None:
        HookRegistry.apply_hooks()
        return
    for target, fn, kind in _PENDING:  # no HookRegistry: plain monkeypatch + stale-binding fix
        if target not in _PATCHED:
            _monkeypatch(target, fn, kind)
            _PATCHED.add(target)


def _monkeypatch(target: str, fn, kind: str) -> None:
    import functools
    import pkgutil
    import types

    obj_path, attr = target.rsplit(".", 1)
    try:
        obj = pkgutil.resolve_name(obj_path)
    except (ImportError, AttributeError) as e:
        # a target of another SGLang release (e.g. DualGemm, 0.5.2x only); the op counters of
        # `tik sglang-check` show whether every hot op still runs through ours
        logger.info("tik: %s is not in this SGLang (%s); not patched", target, e)
        return
    raw = obj.__dict__.get(attr) if isinstance(obj, type) else None
    is_cm = isinstance(raw, classmethod)
    original = raw.__func__ if is_cm else getattr(obj, attr)
    if kind == "replace":
        wrapped = fn
    else:
        @functools.wraps(original)
        def wrapped(*args, **kwargs):
            return fn(original, *args, **kwargs)
    setattr(obj, attr, classmethod(wrapped) if is_cm else wrapped)
    for mod in list(sys.modules.values()):
        if isinstance(mod, types.ModuleType) and mod is not obj:
            for k, v in list(vars(mod).items()):
                if v is original:
                    setattr(mod, k, wrapped)

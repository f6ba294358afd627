"""Kernel implementations: discovery, manifest validation, source-hash check, selection, loading.

An implementation is a folder with ``manifest.json`` and complete kernel sources. It is loaded as a
synthetic package (``_tik_impl_<name>_<hash8>``) straight from its folder, so relative imports inside
it work, and two implementations (e.g. a search parent and its offspring) can be loaded side by side.

Selection: ``TIK_IMPLEMENTATION`` (a name under ``kernels/`` or a folder path) wins; otherwise
``kernels/selection.json`` maps the running GPU's arch (``sm_90``...) or ``cpu`` to a name.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

MANIFEST = "manifest.json"
_HASHED_SUFFIXES = (".py", ".cu", ".cuh", ".cpp", ".h", ".json", ".yaml", ".md")
REQUIRED_MANIFEST_KEYS = (
    "name",
    "language",
    "target_arch",
    "entry_points",
    "shared_regions",
    "numerical_requirements",
    "source_hash",
)


class ImplementationError(RuntimeError):
    """An implementation is missing, malformed, or its sources do not match its manifest hash."""


def kernels_root() -> str:
    """The folder holding the implementations and ``selection.json``.

    An installed wheel has it at ``areal_tik_plugin/kernels/``; a checkout (and an editable install)
    at ``kernels/`` beside the package. That folder has no ``__init__.py``: with one, running Python
    from the repository root would make it the top-level ``kernels`` package and shadow the PyPI
    ``kernels`` distribution that transformers imports.
    """
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for root in (os.path.join(pkg, "kernels"), os.path.join(os.path.dirname(pkg), "kernels")):
        if os.path.isfile(os.path.join(root, "selection.json")):
            return root
    raise ImplementationError(
        f"no kernels folder with selection.json at {os.path.join(pkg, 'kernels')} (installed wheel) or "
        f"{os.path.join(os.path.dirname(pkg), 'kernels')} (checkout); reinstall areal-tik-plugin")


def source_files(path: str) -> list[str]:
    """Relative paths of the files that make up an implementation's source (sorted)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for fn in filenames:
            rel = os.path.relpath(os.path.join(dirpath, fn), path)
            if rel == MANIFEST or not fn.endswith(_HASHED_SUFFIXES):
                continue
            out.append(rel.replace(os.sep, "/"))
    return sorted(out)


def compute_source_hash(path: str) -> str:
    """sha256 over (relative path, bytes) of every source file except the manifest."""
    h = hashlib.sha256()
    for rel in source_files(path):
        with open(os.path.join(path, rel), "rb") as f:
            data = f.read()
        h.update(rel.encode())
        h.update(b"\0")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def read_manifest(path: str) -> dict[str, Any]:
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise ImplementationError(f"no {MANIFEST} in implementation folder {path!r}")
    with open(mpath) as f:
        try:
            man = json.load(f)
        except json.JSONDecodeError as e:
            raise ImplementationError(f"{mpath}: invalid JSON ({e})") from e
    missing = [k for k in REQUIRED_MANIFEST_KEYS if k not in man]
    if missing:
        raise ImplementationError(f"{mpath}: missing keys {missing}; expected {list(REQUIRED_MANIFEST_KEYS)}")
    if not isinstance(man["entry_points"], dict) or not man["entry_points"]:
        raise ImplementationError(f"{mpath}: entry_points must be a non-empty mapping op -> 'module:function'")
    for op, target in man["entry_points"].items():
        if not isinstance(target, str) or ":" not in target:
            raise ImplementationError(f"{mpath}: entry point {op!r} must be 'module:function', got {target!r}")
    return man


def write_manifest_hash(path: str) -> str:
    """Recompute the source hash and store it in the manifest (used after editing sources)."""
    man = read_manifest(path)
    man["source_hash"] = compute_source_hash(path)
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(man, f, indent=2, sort_keys=False)
        f.write("\n")
    os.replace(tmp, os.path.join(path, MANIFEST))
    return man["source_hash"]


@dataclass
class Implementation:
    name: str
    path: str
    manifest: dict[str, Any]
    source_hash: str
    package: str = ""
    _modules: dict[str, types.ModuleType] = field(default_factory=dict)
    _launch_set: bool = False

    def module(self, mod: str) -> types.ModuleType:
        if mod not in self._modules:
            self._modules[mod] = importlib.import_module(f"{self.package}.{mod}")
            if not self._launch_set:  # the first module imported brings in the shared launch helpers
                rowops = sys.modules.get(f"{self.package}._rowops")
                if rowops is not None:
                    _apply_fast_launch(rowops)
                    self._install_native_launch()
                    self._launch_set = True
            _guard_modules(self.package)
        return self._modules[mod]

    def _install_native_launch(self) -> None:
        """The manifest's ``native_host_path.launch`` (``module:attr`` of the kernel modules' launch helper,
        ``fn(kernel, grid, *args, **kw)``) and ``launch_packed`` (a list of ``module:attr`` of helpers taking
        ``(kernel, grid, args, kw)``) are handed to the :func:`on_launch_helper` callbacks (the generic native
        launcher wraps them). A packed helper's module is imported here; one that cannot be imported with this
        Triton (its kernels cannot run either) is left alone."""
        native = self.manifest.get("native_host_path") or {}
        specs = ([(native["launch"], False)] if native.get("launch") else []) + \
            [(sp, True) for sp in native.get("launch_packed") or []]
        for spec, packed in specs:
            name, _, attr = spec.partition(":")
            try:
                mod = sys.modules.get(f"{self.package}.{name}") or importlib.import_module(f"{self.package}.{name}")
            except ImportError:
                if not packed:
                    raise
                continue
            if not callable(getattr(mod, attr, None)):
                key = "launch_packed" if packed else "launch"
                raise ImplementationError(f"implementation {self.name!r}: native_host_path.{key} names {spec!r}, "
                                          f"which is not a function of {self.package}.{name}")
            _LAUNCH_HELPERS.append((mod, attr, packed))
            for fn in list(_LAUNCH_LISTENERS):
                fn(mod, attr, packed)

    def entry(self, op: str):
        """The callable behind an entry point named in the manifest (e.g. ``attention.decode``)."""
        try:
            target = self.manifest["entry_points"][op]
        except KeyError:
            raise ImplementationError(
                f"implementation {self.name!r} has no entry point {op!r}; it has "
                f"{sorted(self.manifest['entry_points'])}"
            ) from None
        mod, fn = target.split(":", 1)
        return getattr(self.module(mod), fn)

    @property
    def contract(self) -> types.ModuleType:
        return self.module("contract")


_lock = threading.Lock()
_loaded: dict[str, Implementation] = {}


def load_implementation(path: str, *, verify_hash: bool = True) -> Implementation:
    """Load the implementation in folder ``path`` (its manifest hash must match its sources)."""
    from areal_tik_plugin.runtime.interp import ensure_interpreter_if_no_gpu

    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise ImplementationError(f"implementation folder {path!r} does not exist")
    man = read_manifest(path)
    actual = compute_source_hash(path)
    if verify_hash and man["source_hash"] != actual:
        raise ImplementationError(
            f"implementation {man['name']!r} at {path}: manifest source_hash {man['source_hash'][:12]} "
            f"does not match its sources ({actual[:12]}); an implementation is never edited in place "
            f"(run `tik kernels rehash {man['name']}` only when creating a new one)"
        )
    # -- search exports carry their audits: refused on a GPU without a passing one (search/export.py) --
    if man.get("evidence_required") == "search_audit":
        from areal_tik_plugin.search.export import require_evidence

        require_evidence(path, man, actual, device_arch())
    # --------------------------------------------------------------------------------------------------
    key = f"{path}:{actual}"
    with _lock:
        if key in _loaded:
            return _loaded[key]
        check_versions()
        ensure_interpreter_if_no_gpu()
        pkg = f"_tik_impl_{man['name']}_{actual[:8]}"
        if pkg not in sys.modules:
            mod = types.ModuleType(pkg)
            mod.__path__ = [path]  # type: ignore[attr-defined]
            mod.__file__ = os.path.join(path, "__init__.py")
            mod.__package__ = pkg
            sys.modules[pkg] = mod
        impl = Implementation(name=man["name"], path=path, manifest=man, source_hash=actual, package=pkg)
        _loaded[key] = impl
        return impl


def device_arch() -> str:
    """``sm_XY`` for the current CUDA device, or ``cpu`` when none."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def triton_minor() -> str | None:
    """``"3.6"`` for the installed Triton (read from its package metadata: no import), ``None`` without one."""
    mod = sys.modules.get("triton")
    ver = getattr(mod, "__version__", None)
    if ver is None:
        from importlib import metadata

        try:
            ver = metadata.version("triton")
        except metadata.PackageNotFoundError:
            return None
    return ".".join(ver.split(".")[:2])


def selected_name(arch: str | None = None, triton: str | None = None) -> str:
    """The implementation for ``arch`` (default: this process's GPU): ``TIK_IMPLEMENTATION`` if set, else
    ``kernels/selection.json``'s entry ``<arch>+triton<major.minor>`` for the installed Triton (or
    ``triton``) when it has one, else its entry for ``arch``, else ``default``. A per-Triton entry keeps an
    implementation off a Triton its code was not built and measured with (the Gluon prefill: Triton 3.6)."""
    env = os.environ.get("TIK_IMPLEMENTATION")
    if env:
        return env
    arch = arch or device_arch()
    with open(os.path.join(kernels_root(), "selection.json")) as f:
        sel = json.load(f)
    tm = triton or triton_minor()
    return (tm and sel.get(f"{arch}+triton{tm}")) or sel.get(arch) or sel["default"]


def resolve_path(name_or_path: str) -> str:
    if os.path.sep in name_or_path or os.path.isdir(name_or_path):
        return os.path.abspath(name_or_path)
    path = os.path.join(kernels_root(), name_or_path)
    if not os.path.isdir(path):
        raise ImplementationError(
            f"unknown implementation {name_or_path!r}; expected one of {list_implementations()} or a folder path"
        )
    return path


_current: Implementation | None = None


def _apply_fast_launch(rowops: types.ModuleType) -> None:
    """The short launch path (free knob ``_rowops.FAST_LAUNCH``) is off unless ``TIK_FAST_LAUNCH=1`` (for
    this process and its children, e.g. SGLang's scheduler processes); ``0`` or unset: Triton's own launch
    path; any other value is refused.

    Why opt-in: it changes host time only (no bit; the suite's ``fast_launch`` checks), and that gain did
    not hold up. ``ops.linear``'s host time, both paths in one process: 53.6 (short) vs 69.7 us (Triton's)
    on one device host, 78.8 vs 69.4 us on another. SGLang's CUDA-graph decode
    (qwen3-4b shape, batch 32) on one host in one call (``gpu_integrations.sh sglang-ab``): the
    greedy job 0.90 s with the path vs 1.17 s without, the sampled job 1.51 vs 1.08 s, i.e. opposite signs,
    no effect shown."""
    v = os.environ.get("TIK_FAST_LAUNCH")
    if v == "1":
        return
    if v not in (None, "", "0"):
        raise ValueError(f"TIK_FAST_LAUNCH={v!r}: expected '1' (the short launch path) or '0' / unset "
                         "(Triton's own launch path)")
    if hasattr(rowops, "FAST_LAUNCH"):
        rowops.FAST_LAUNCH = False


_VERSIONS_CHECKED = False


def check_versions() -> None:
    """Refuse a Triton / torch the kernels do not run with, saying which to install
    (:mod:`areal_tik_plugin.versions`); once per process, before the first kernel module is imported."""
    global _VERSIONS_CHECKED
    if _VERSIONS_CHECKED:
        return
    from areal_tik_plugin import versions

    versions.check_torch()
    versions.check_triton()
    _VERSIONS_CHECKED = True


REQUIRE_EVIDENCE_ENV = "TIK_REQUIRE_EVIDENCE"
_EVIDENCE_STATUS: dict = {}


def evidence_status(impl: Implementation | None = None) -> dict:
    """Whether GPU evidence covers ``impl`` (default: the selected one) x this process's Triton x torch x
    GPU (:func:`areal_tik_plugin.evidence.find_qualification`); on a machine without a GPU the kernels run
    in Triton's interpreter and GPU evidence does not apply (``covered`` is None)."""
    import torch

    impl = impl or get_implementation()
    if impl.source_hash in _EVIDENCE_STATUS:
        return _EVIDENCE_STATUS[impl.source_hash]
    if not torch.cuda.is_available():
        st = {"covered": None, "source": None, "other_envs": [],
              "message": "no CUDA GPU: kernels run in Triton's interpreter (GPU evidence does not apply)"}
    else:
        from areal_tik_plugin import evidence

        st = evidence.find_qualification(impl)
    _EVIDENCE_STATUS[impl.source_hash] = st
    return st


def _report_evidence(impl: Implementation) -> None:
    """At the first kernel load on a GPU: warn (``TIK_REQUIRE_EVIDENCE=1``: refuse) when no evidence
    covers this environment."""
    import warnings

    req = os.environ.get(REQUIRE_EVIDENCE_ENV, "")
    if req not in ("", "0", "1"):
        raise ValueError(f"{REQUIRE_EVIDENCE_ENV}={req!r}: expected '1' (refuse without evidence) or '0' / unset")
    st = evidence_status(impl)
    if st["covered"] is False:
        if req == "1":
            raise ImplementationError(f"areal_tik_plugin: {st['message']} ({REQUIRE_EVIDENCE_ENV}=1)")
        warnings.warn(f"areal_tik_plugin: {st['message']}", RuntimeWarning, stacklevel=3)


def get_implementation() -> Implementation:
    """The implementation selected for this process (loaded once, hash-checked; the first load on a GPU
    reports whether evidence covers this environment)."""
    global _current
    if _current is None:
        impl = load_implementation(resolve_path(selected_name()))
        _report_evidence(impl)
        _current = impl
    return _current


def current_module(mod: str) -> types.ModuleType:
    """``get_implementation().module(mod)`` for the ops' hot path: once loaded, two attribute reads and
    one dict lookup (no lock, no import statement). Follows :func:`set_implementation`."""
    impl = _current if _current is not None else get_implementation()
    m = impl._modules.get(mod)
    return m if m is not None else impl.module(mod)


def set_implementation(name_or_path: str | None) -> Implementation | None:
    """Switch the process to another implementation (``None`` resets to the default selection)."""
    global _current
    _current = None if name_or_path is None else load_implementation(resolve_path(name_or_path))
    _changed()
    return _current


# Callbacks run when the implementation in use changes or a knob (an attribute of one of its modules) is
# set: whatever was derived from the loaded kernels (the native host path's launch plans) must be dropped.
# A hook, so that the loader imports nothing of what builds on it.
_CHANGE_LISTENERS: list = []


# Launch helpers of the loaded implementations (module, attribute) and the callbacks that wrap them
# (areal_tik_plugin.runtime.native.launch registers itself when imported): a hook, as for on_change.
_LAUNCH_HELPERS: list = []
_LAUNCH_LISTENERS: list = []


def on_launch_helper(fn) -> None:
    """Call ``fn(module, attr, packed)`` for the launch helpers of every implementation loaded so far and
    later (``packed``: the helper takes ``(kernel, grid, args, kw)``)."""
    if fn in _LAUNCH_LISTENERS:
        return
    _LAUNCH_LISTENERS.append(fn)
    for mod, attr, packed in list(_LAUNCH_HELPERS):
        fn(mod, attr, packed)


def on_change(fn) -> None:
    """Call ``fn()`` whenever the implementation is switched or one of its modules' attributes is set."""
    if fn not in _CHANGE_LISTENERS:
        _CHANGE_LISTENERS.append(fn)


def _changed() -> None:
    for fn in list(_CHANGE_LISTENERS):
        fn()


class GuardedModule(types.ModuleType):
    """Module class of a loaded implementation's modules: setting an attribute (a knob) runs the
    :func:`on_change` callbacks."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        _changed()

    def __delattr__(self, name):
        super().__delattr__(name)
        _changed()


def _guard_modules(package: str) -> None:
    """Give every loaded module of an implementation the :class:`GuardedModule` class."""
    prefix = package + "."
    for name, m in list(sys.modules.items()):
        if name.startswith(prefix) and m is not None and type(m) is types.ModuleType:
            m.__class__ = GuardedModule


def list_implementations() -> list[str]:
    root = kernels_root()
    return sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, MANIFEST)))


def jit_cache_dir(impl: Implementation, arch: str | None = None) -> str:
    """Where JIT builds (CUDA C++ via torch cpp_extension) of ``impl`` go: outside the package."""
    base = os.environ.get("TIK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "areal_tik_plugin"
    )
    d = os.path.join(base, "jit", impl.name, impl.source_hash[:16], arch or device_arch())
    os.makedirs(d, exist_ok=True)
    return d

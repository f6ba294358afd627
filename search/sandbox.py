"""Isolation of a candidate's evaluation: static source check, process limits, environment, integrity.

Layers, from the cheapest to the last line:

1. :func:`static_check` (parent side, before any candidate byte runs): every changed or new source
   file of the candidate may import only the allowed modules (``ALLOWED_IMPORTS`` and its own package
   through relative imports), may not assign to attributes of imported modules (``time.perf_counter =
   ...``, ``torch.cuda.Event = ...``), may not use the escape hatches of Python (``eval``, ``exec``,
   ``__import__``, ``open``, ``setattr``, ``globals``, dunder attributes such as ``__dict__`` or
   ``__subclasses__``) nor reach dangerous modules as attributes (``torch.os``, ``cpp_extension``).
   Files byte-identical to the root snapshot's are exempt (the root is reviewed code); in a changed
   file an import the root's version of the same file already had stays allowed, limited to the
   attribute names the root used on it (``_rowops.py`` reads ``os.environ``; a candidate may still
   read it, not call ``os.system``).
2. The worker process: a new session (``setsid``, so one process group), a scrubbed environment
   (:func:`scrubbed_env`: no API keys, no proxies, ``HOME`` and ``TMPDIR`` in its own temporary
   folder, which is also its working directory), resource limits (:func:`limits`, applied between
   ``fork`` and ``exec``), a private network namespace where the kernel allows it
   (:func:`unshare_network`, called by the worker before it imports anything heavy; the reason is
   recorded when it is not possible), killed as a whole group at the end of every audit, and every
   process still carrying the audit's token, session or group hunted down (:func:`kill_audit`).
3. :class:`Snapshot`: the run directory (records, spec, every implementation folder), the evaluator
   sources and the spec file are hashed before and re-hashed after every audit; a changed, added or
   removed byte is restored from the copy taken before and the audit becomes ``infra_error`` with
   the paths named.
"""

from __future__ import annotations

import ast
import errno
import hashlib
import os
import resource
import secrets
import signal
import time
from typing import Any, Iterable

# top-level modules a candidate source may import (submodules included, DENIED_MODULES excepted)
ALLOWED_IMPORTS = frozenset({"__future__", "triton", "torch", "math", "functools", "typing", "dataclasses",
                             "itertools", "operator", "enum"})
DENIED_MODULES = ("torch.utils.cpp_extension", "torch.multiprocessing", "torch.distributed", "torch.hub",
                  "torch.utils.data", "torch.package", "torch.serialization", "torch.jit", "torch._dynamo",
                  "triton.runtime.build", "triton.backends.nvidia.driver")
FORBIDDEN_NAMES = frozenset({"eval", "exec", "compile", "__import__", "open", "setattr", "delattr", "globals",
                             "locals", "vars", "breakpoint", "input", "__builtins__", "__loader__", "__spec__",
                             "exit", "quit", "help"})
# attribute names that reach the process, the file system or native code from an allowed module
FORBIDDEN_ATTRS = frozenset({"os", "sys", "subprocess", "builtins", "ctypes", "importlib", "socket", "shutil",
                             "pathlib", "inspect", "gc", "cpp_extension", "load_inline", "multiprocessing", "hub",
                             "pickle", "marshal", "signal", "threading", "_thread", "system", "popen", "environ",
                             "load_library", "_C", "f_globals", "f_locals", "f_back", "gi_frame", "tb_frame",
                             "func_globals", "co_code"})
ALLOWED_DUNDERS = frozenset({"__name__", "__version__", "__init__", "__doc__", "__future__"})


class Violation(str):
    """One static-check finding: ``file:line: what``."""


def _module_root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    while isinstance(node, ast.Call):
        node = node.func
        while isinstance(node, ast.Attribute):
            node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _denied(mod: str) -> bool:
    return any(mod == d or mod.startswith(d + ".") for d in DENIED_MODULES)


def _file_imports(tree: ast.AST) -> dict[str, set[str]]:
    """alias -> attribute names used on it, for every absolute import of a module (used by the root)."""
    aliases: dict[str, set[str]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                aliases.setdefault(a.asname or a.name.split(".")[0], set())
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
            for a in n.names:
                aliases.setdefault(a.asname or a.name, set())
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases:
            aliases[n.value.id].add(n.attr)
    return aliases


def _imported_modules(tree: ast.AST) -> dict[str, str]:
    """alias -> module path for every absolute import."""
    out: dict[str, str] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
            for a in n.names:
                out[a.asname or a.name] = f"{n.module}.{a.name}"
    return out


def check_source(rel: str, text: str, root_text: str | None = None) -> list[Violation]:
    """Violations of one candidate source file (``root_text``: the root's version of the same file)."""
    try:
        tree = ast.parse(text, filename=rel)
    except SyntaxError as e:
        return [Violation(f"{rel}:{e.lineno}: syntax error: {e.msg}")]
    grand: dict[str, set[str]] = {}
    grand_mods: set[str] = set()
    if root_text is not None:
        try:
            rtree = ast.parse(root_text)
            grand = _file_imports(rtree)
            grand_mods = set(_imported_modules(rtree).values())
        except SyntaxError:
            pass
    out: list[Violation] = []

    def bad(node, what):
        out.append(Violation(f"{rel}:{getattr(node, 'lineno', 0)}: {what}"))

    modules = _imported_modules(tree)
    foreign = set(modules)  # names bound to a module (or an object reached from one)
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            if isinstance(n, ast.ImportFrom) and n.level:
                if n.level > 1:
                    bad(n, f"relative import above the implementation's own package (level {n.level})")
                continue
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
            for m in names:
                top = m.split(".")[0]
                if _denied(m):
                    bad(n, f"import of {m} (denied: native code, processes or serialization)")
                elif top not in ALLOWED_IMPORTS and m not in grand_mods and top not in grand_mods:
                    bad(n, f"import of {m!r}: outside the allowed set {sorted(ALLOWED_IMPORTS)} and own modules")
            if isinstance(n, ast.ImportFrom):
                for a in n.names:
                    if a.name == "*":
                        bad(n, f"star import from {n.module}")
                    elif _denied(f"{n.module}.{a.name}") or a.name in FORBIDDEN_ATTRS:
                        bad(n, f"import of {n.module}.{a.name} (denied)")
    # simple taint: a name assigned from an expression rooted at a module alias refers into that module
    for _ in range(2):
        for n in ast.walk(tree):
            if isinstance(n, ast.Assign) and isinstance(n.value, (ast.Name, ast.Attribute)):
                if _module_root(n.value) in foreign:
                    for t in n.targets:
                        if isinstance(t, ast.Name):
                            foreign.add(t.id)
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id in FORBIDDEN_NAMES:
            bad(n, f"use of {n.id!r} (escape hatch of the interpreter)")
        elif isinstance(n, ast.Attribute):
            a = n.attr
            if a.startswith("__") and a.endswith("__") and a not in ALLOWED_DUNDERS:
                bad(n, f"dunder attribute {a!r}")
            elif a in FORBIDDEN_ATTRS:
                base = n.value.id if isinstance(n.value, ast.Name) else None
                if not (base is not None and a in grand.get(base, set())):
                    bad(n, f"attribute {a!r} (reaches the process, files or native code)")
            elif isinstance(n.value, ast.Name) and n.value.id in grand and n.value.id in modules \
                    and modules[n.value.id].split(".")[0] not in ALLOWED_IMPORTS \
                    and a not in grand[n.value.id]:
                bad(n, f"{n.value.id}.{a}: the root's version of this file uses only "
                       f"{sorted(grand[n.value.id])} of {n.value.id}")
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr":
            if len(n.args) < 2 or not isinstance(n.args[1], ast.Constant) or not isinstance(n.args[1].value, str) \
                    or n.args[1].value.startswith("__") or n.args[1].value in FORBIDDEN_ATTRS:
                bad(n, "getattr with a computed, dunder or forbidden attribute name")
        targets: list[ast.AST] = []
        if isinstance(n, ast.Assign):
            targets = list(n.targets)
        elif isinstance(n, (ast.AugAssign, ast.AnnAssign)):
            targets = [n.target]
        elif isinstance(n, ast.Delete):
            targets = list(n.targets)
        for t in targets:
            for tt in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]):
                if isinstance(tt, (ast.Attribute, ast.Subscript)) and _module_root(tt) in foreign:
                    bad(tt, f"assignment into the foreign module {_module_root(tt)!r} (monkeypatching)")
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            for g in n.names:
                if g in foreign:
                    bad(n, f"rebinding the module name {g!r}")
    return out


def static_check(impl_dir: str, root_dir: str | None) -> list[Violation]:
    """Violations over the candidate's ``.py`` files; files identical to the root's are exempt."""
    out: list[Violation] = []
    for dirpath, dirnames, filenames in os.walk(impl_dir):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            full = os.path.join(dirpath, fn)
            rel = os.path.relpath(full, impl_dir)
            if fn.endswith((".so", ".pyd", ".pth", ".pyc")):
                out.append(Violation(f"{rel}: native or compiled file in a candidate"))
                continue
            if not fn.endswith(".py"):
                continue
            with open(full, encoding="utf-8", errors="replace") as f:
                text = f.read()
            root_text = None
            if root_dir is not None and os.path.isfile(os.path.join(root_dir, rel)):
                with open(os.path.join(root_dir, rel), encoding="utf-8", errors="replace") as f:
                    root_text = f.read()
                if root_text == text:
                    continue
            out.extend(check_source(rel, text, root_text))
    return out


# ------------------------------------------------------------------------------------------------
# process: environment, limits, network, cleanup
# ------------------------------------------------------------------------------------------------
ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "LD_LIBRARY_PATH",
            "TRITON_PTXAS_PATH", "TRITON_LIBCUDA_PATH", "TIK_FAST_LAUNCH", "NVIDIA_VISIBLE_DEVICES",
            "VIRTUAL_ENV", "PYTHONPATH")


def scrubbed_env(device: str, home: str, cpu_threads: int, token: str) -> dict[str, str]:
    """Only what the worker needs: no credentials, no proxies, a private HOME / TMPDIR / caches."""
    env = {k: os.environ[k] for k in ENV_KEEP if k in os.environ}
    env.update({
        "HOME": home, "TMPDIR": os.path.join(home, "tmp"), "XDG_CACHE_HOME": os.path.join(home, "cache"),
        "TRITON_CACHE_DIR": os.path.join(home, "triton"), "TIK_CACHE_DIR": os.path.join(home, "tik"),
        "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1",
        "TIK_AUDIT_TOKEN": token,
    })
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["OMP_NUM_THREADS"] = str(cpu_threads)
    for d in ("tmp", "cache", "triton", "tik"):
        os.makedirs(os.path.join(home, d), exist_ok=True)
    return env


def limits(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """The resource limits of a worker (``evaluation.limits`` overrides): CPU seconds, address space
    (CPU only: CUDA reserves far more virtual memory than it uses), file size, core dumps, processes."""
    ev = (spec.get("evaluation") or {}).get("limits") or {}
    cpu = spec["target"]["device"] == "cpu"
    return {
        "cpu_s": int(ev.get("cpu_s", max(30, 2 * timeout_s))),
        "address_space_gb": ev.get("address_space_gb", 24 if cpu else None),
        "file_size_mb": int(ev.get("file_size_mb", 512)),
        "nproc": int(ev.get("nproc", 4096)),
    }


def preexec(lim: dict[str, Any]):
    """The function run in the child between fork and exec (after setsid)."""
    def apply():
        def setl(kind, v):
            try:
                resource.setrlimit(kind, (v, v))
            except (ValueError, OSError):
                pass
        setl(resource.RLIMIT_CPU, int(lim["cpu_s"]))
        if lim.get("address_space_gb"):
            setl(resource.RLIMIT_AS, int(float(lim["address_space_gb"]) * (1 << 30)))
        setl(resource.RLIMIT_FSIZE, int(lim["file_size_mb"]) << 20)
        setl(resource.RLIMIT_CORE, 0)
        # per user, and not enforced for root (CAP_SYS_RESOURCE): the group kill below is what holds there
        setl(resource.RLIMIT_NPROC, int(lim["nproc"]))
    return apply


CLONE_NEWNET = 0x40000000


def unshare_network() -> dict[str, Any]:
    """Move this process into a new, empty network namespace (only loopback, down). Returns what was
    done or why not (needs CAP_SYS_ADMIN or unprivileged user namespaces)."""
    before = _netns()
    try:
        if hasattr(os, "unshare"):
            os.unshare(CLONE_NEWNET)  # type: ignore[attr-defined]
        else:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNET) != 0:
                e = ctypes.get_errno()
                raise OSError(e, os.strerror(e))
    except (OSError, AttributeError) as e:
        return {"network": "shared", "reason": f"unshare(CLONE_NEWNET) failed: {e}", "netns": before}
    return {"network": "unshared", "method": "unshare(CLONE_NEWNET)", "netns": _netns(), "netns_parent": before}


def _netns() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return "?"


def new_token() -> str:
    return secrets.token_hex(12)


def _proc_info(pid: int) -> tuple[int, int, int] | None:
    """(ppid, pgid, sid) of a process from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        rest = s[s.rindex(")") + 2:].split()
        return int(rest[1]), int(rest[2]), int(rest[3])
    except (OSError, ValueError, IndexError):
        return None


def _has_token(pid: int, token: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"TIK_AUDIT_TOKEN={token}".encode() in f.read()
    except OSError:
        return False


PR_SET_CHILD_SUBREAPER = 36
_subreaper: bool | None = None


def become_subreaper() -> bool:
    """Make this (evaluator) process the reaper of orphaned descendants, so a candidate's child that
    left the session, the process group and the environment still shows up here as our child."""
    global _subreaper
    if _subreaper is None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            _subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            _subreaper = False
    return bool(_subreaper)


def children_of_me() -> set[int]:
    me = os.getpid()
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _proc_info(int(name))
            if info is not None and info[0] == me:
                out.add(int(name))
    return out


def audit_processes(leader: int, token: str, known_children: set[int] | None = None) -> list[int]:
    """Live processes of one audit: its session / process group, carrying its token, or (with the
    subreaper on) orphans re-parented to this process since the audit started, and their trees."""
    me = os.getpid()
    out = []
    infos = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            info = _proc_info(int(name))
            if info is not None:
                infos[int(name)] = info
    tree = {leader}
    if known_children is not None:
        tree |= {p for p, i in infos.items() if i[0] == me and p not in known_children}
    if True:
        grew = True
        while grew:
            grew = False
            for p, i in infos.items():
                if p not in tree and i[0] in tree:
                    tree.add(p)
                    grew = True
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me:
            continue
        info = _proc_info(pid)
        if info is None:
            continue
        _, pgid, sid = info
        if pgid == leader or sid == leader or pid in tree or _has_token(pid, token):
            out.append(pid)
    return out


def kill_audit(leader: int, token: str, known_children: set[int] | None = None, rounds: int = 8) -> list[int]:
    """SIGKILL the worker's group and every process of the audit found in /proc; returns the pids
    killed outside the group (a candidate's detached children). Orphans re-parented to us are reaped."""
    stray: list[int] = []
    for _ in range(rounds):
        try:
            os.killpg(leader, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        found = audit_processes(leader, token, known_children)
        for p in found:
            if p != leader and _proc_info(p) is not None and _proc_info(p)[0] == os.getpid() and _zombie(p):
                try:
                    os.waitpid(p, os.WNOHANG)
                except ChildProcessError:
                    pass
        left = [p for p in found if not _zombie(p)]
        if not left and _zombie(leader):
            break
        for p in left:
            info = _proc_info(p)
            if info is not None and info[1] != leader:
                stray.append(p)
            try:
                os.kill(p, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    for p in set(stray):
        try:
            os.waitpid(p, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass
    return sorted(set(stray))


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        return s[s.rindex(")") + 2] == "Z"
    except (OSError, ValueError, IndexError):
        return True


# ------------------------------------------------------------------------------------------------
# integrity of the run directory and the evaluator
# ------------------------------------------------------------------------------------------------
RUN_EXCLUDE = ("work", "report", ".lock")


def _walk(root: str, exclude: Iterable[str] = ()) -> list[str]:
    out = []
    ex = set(exclude)
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d not in ex]
            filenames = [f for f in filenames if f not in ex]
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fn in filenames:
            out.append(os.path.normpath(os.path.join(rel_dir, fn)))
    return sorted(out)


class Snapshot:
    """Bytes of the run directory (minus scratch) and of extra files, taken before an audit."""

    def __init__(self, run_root: str, extra_files: Iterable[str]):
        self.run_root = run_root
        self.files: dict[str, bytes] = {}
        for rel in _walk(run_root, RUN_EXCLUDE):
            self.files[os.path.join(run_root, rel)] = _read_bytes(os.path.join(run_root, rel))
        for p in extra_files:
            self.files[os.path.abspath(p)] = _read_bytes(p)
        self.extra = [os.path.abspath(p) for p in extra_files]
        self.digest = self._digest(self.files)

    @staticmethod
    def _digest(files: dict[str, bytes]) -> str:
        h = hashlib.sha256()
        for p in sorted(files):
            h.update(p.encode() + b"\0" + hashlib.sha256(files[p]).digest())
        return h.hexdigest()

    def changes(self) -> list[str]:
        """Paths changed, added (``+``) or removed (``-``) since the snapshot."""
        now = set(os.path.join(self.run_root, r) for r in _walk(self.run_root, RUN_EXCLUDE))
        out = []
        for p, data in self.files.items():
            if not os.path.exists(p):
                out.append(f"-{p}")
            elif _read_bytes(p) != data:
                out.append(p)
        for p in sorted(now - set(self.files)):
            out.append(f"+{p}")
        return out

    def restore(self) -> None:
        """Put back every byte as it was (added files removed)."""
        for ch in self.changes():
            if ch.startswith("+"):
                p = ch[1:]
                try:
                    os.chmod(p, 0o644)
                    os.unlink(p)
                except OSError:
                    pass
                continue
            p = ch[1:] if ch.startswith("-") else ch
            os.makedirs(os.path.dirname(p), exist_ok=True)
            tmp = f"{p}.restore.tmp"
            with open(tmp, "wb") as f:
                f.write(self.files[p])
            os.replace(tmp, p)
        # directories the candidate created inside the run directory (empty after the files went)
        for dirpath, dirnames, filenames in os.walk(self.run_root, topdown=False):
            rel = os.path.relpath(dirpath, self.run_root)
            if rel.split(os.sep)[0] in RUN_EXCLUDE or rel == ".":
                continue
            if not os.listdir(dirpath) and not any(k.startswith(dirpath + os.sep) for k in self.files):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass


def _read_bytes(p: str) -> bytes:
    try:
        with open(p, "rb") as f:
            return f.read()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.EISDIR):
            return b""
        raise

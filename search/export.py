"""Search, then train: turn a verified implementation of a run into an installable implementation folder.

``tik search export RUN [--id I####] --name NAME [--dest DIR]`` copies the implementation's complete
source tree (default: the run's best) to ``DIR/NAME`` (default ``DIR``: the installed ``kernels/``),
with a manifest naming it, its parent and the run it came from, and its evidence: every audit of it
in the run (the promoting one, re-audits) as one JSON line each in ``search_evidence.jsonl`` (not a
hashed source suffix, so the source hash stays the one the audits measured; each line carries it).

The manifest gets ``"evidence_required": "search_audit"``: the loader then refuses the implementation
on a device for which no passing audit of exactly these sources exists (:func:`require_evidence`),
unless ``TIK_FORCE_IMPLEMENTATION=1``; the CPU (Triton interpreter / pure torch) is exempt because
timings there say nothing and correctness is re-checked by ``tik verify``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

EVIDENCE_FILE = "search_evidence.jsonl"
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
FORCE_ENV = "TIK_FORCE_IMPLEMENTATION"


class ExportError(ValueError):
    """The implementation cannot be exported (not verified, revoked, name taken...)."""


def _arch_of(env: dict[str, Any]) -> str:
    if env.get("device") == "cpu" or not env.get("sm"):
        return "cpu"
    sm = str(env.get("sm"))
    return sm if sm.startswith("sm_") else f"sm_{sm.replace('.', '')}"


def export(run, *, name: str, iid: str | None = None, dest: str | None = None) -> dict[str, Any]:
    from areal_tik_plugin.runtime import loader

    if not isinstance(name, str) or not NAME_RE.match(name):
        raise ExportError(f"--name {name!r}: expected a Python-identifier-like name (letters, digits, _), "
                          "it becomes part of the loader's package name")
    st = run.state()
    iid = iid or st.best
    if iid not in run.impls:
        raise ExportError(f"unknown implementation {iid!r}; the run has {sorted(run.impls)}")
    if iid in st.revoked:
        raise ExportError(f"{iid} was revoked ({st.revoked[iid]}): its verdict no longer stands")
    if iid not in st.verified:
        raise ExportError(f"{iid} is not verified in this run; export a verified one (best: {st.best})")
    audits = [a for a in run.audits.values() if a.implementation == iid]
    passing = [a for a in audits if a.status == "ok" and a.verified]
    if not passing:
        raise ExportError(f"{iid} has no passing audit")
    src = run.impl_dir(iid)
    h = loader.compute_source_hash(src)
    if h != run.impls[iid].source_hash:
        raise ExportError(f"{iid}: sources ({h[:12]}) differ from its record ({run.impls[iid].source_hash[:12]})")
    dest = os.path.abspath(dest or loader.kernels_root())
    out = os.path.join(dest, name)
    if os.path.exists(out):
        raise ExportError(f"{out} already exists; choose another --name (implementations are never overwritten)")
    tmp = os.path.join(dest, f".{name}.export.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(dest, exist_ok=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    man = loader.read_manifest(tmp)
    parent = man.get("name")
    man.update({
        "name": name, "parent": parent, "evidence_required": "search_audit",
        "search": {"run": run.root, "implementation": iid, "audits": [a.id for a in passing],
                   "spec": run.spec["name"], "spec_hash": run.meta["spec_hash"], "root": run.meta.get("root_name"),
                   "best": st.best == iid},
    })
    with open(os.path.join(tmp, loader.MANIFEST), "w") as f:
        json.dump(man, f, indent=2)
        f.write("\n")
    if loader.write_manifest_hash(tmp) != h:
        raise ExportError("the exported copy hashes differently from the audited sources")  # pragma: no cover
    from areal_tik_plugin.search import ir

    with open(os.path.join(tmp, EVIDENCE_FILE), "w") as f:
        for a in sorted(audits, key=lambda a: a.id):
            f.write(json.dumps({"kind": "search_audit", "source_hash": h, "arch": _arch_of(a.env),
                                "status": a.status, "verified": a.verified, "spec": run.spec["name"],
                                "spec_hash": run.meta["spec_hash"], "audit": ir.to_json(a)}, default=str) + "\n")
    os.replace(tmp, out)
    return {"path": out, "name": name, "parent": parent, "implementation": iid, "source_hash": h,
            "audits": [a.id for a in passing]}


def evidence_for(path: str, source_hash: str) -> list[dict[str, Any]]:
    p = os.path.join(path, EVIDENCE_FILE)
    if not os.path.isfile(p):
        return []
    out = []
    with open(p) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if rec.get("source_hash") == source_hash:
                    out.append(rec)
    return out


def require_evidence(path: str, manifest: dict[str, Any], source_hash: str, arch: str) -> None:
    """Raise unless ``path`` carries a passing audit of ``source_hash`` on ``arch`` (see module doc)."""
    from areal_tik_plugin.runtime.loader import ImplementationError

    if arch == "cpu" or os.environ.get(FORCE_ENV) == "1":
        return
    recs = evidence_for(path, source_hash)
    if any(r.get("status") == "ok" and r.get("verified") and r.get("arch") == arch for r in recs):
        return
    have = sorted({f"{r.get('arch')}:{r.get('status')}" for r in recs})
    raise ImplementationError(
        f"implementation {manifest.get('name')!r} at {path}: no passing search audit of these sources on {arch} "
        f"(evidence: {have or 'none'}); audit it on this GPU (tik search) or set {FORCE_ENV}=1 to use it anyway")

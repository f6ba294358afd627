"""The optimization IR (paper §4.2) as typed, schema-validated records.

Five record kinds, one JSON file each, written atomically (tmp + fsync + ``os.replace``) and validated
on load against the dataclass field types below. Records are write-once: rewriting a record with
different content is refused (:class:`RecordConflict`), rewriting identical content is a no-op, so a
resumed run can replay its last step safely.

==================  ======  =========================================================================
kind                id      what it links
==================  ======  =========================================================================
opportunity         O0001   mechanism, affected entry points / workloads, supporting audits, the
                            verified implementations it may apply to
implementation      I0001   one complete source tree (folder + manifest + source hash), its parents,
                            target arch, entry points, shared regions, dispatch rules, numerical
                            requirements, knob values
action              A0001   the exact source modification (edits + unified diff), its opportunity,
                            parents -> offspring, targeted workloads, scope, regions, expected effect,
                            numerical risks, the measurement that would falsify it, LLM tokens
audit               E0001   status, compile / correctness / dispatch / latency evidence, T(I), limit
                            violations, hashes, environment, and the promotion + kappa update
decision            L0001   lineage management: interpretation, branch decision, follow-up
                            opportunities, closed opportunities
==================  ======  =========================================================================
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

SCHEMA = "areal-tik-search/1"

STATUSES = ("ok", "compile_error", "runtime_error", "contract_violation", "inaccurate", "timeout", "infra_error")
Status = Literal["ok", "compile_error", "runtime_error", "contract_violation", "inaccurate", "timeout", "infra_error"]
DECISIONS = ("CONTINUE", "MERGE", "ARCHIVE", "ABANDON", "RETRY")
Decision = Literal["CONTINUE", "MERGE", "ARCHIVE", "ABANDON", "RETRY"]
ActionKind = Literal["full_sequence", "decode", "joint"]
OpportunityKind = Literal["initial", "followup", "retry", "merge"]

ID_PATTERNS = {
    "opportunity": re.compile(r"^O\d{4,}$"),
    "implementation": re.compile(r"^I\d{4,}$"),
    "action": re.compile(r"^A\d{4,}$"),
    "audit": re.compile(r"^E\d{4,}$"),
    "decision": re.compile(r"^L\d{4,}$"),
    "revocation": re.compile(r"^R\d{4,}$"),
}
PREFIX = {"opportunity": "O", "implementation": "I", "action": "A", "audit": "E", "decision": "L", "revocation": "R"}
SUBDIR = {"opportunity": "opportunities", "implementation": "implementations", "action": "actions",
          "audit": "audits", "decision": "decisions", "revocation": "revocations"}


class SchemaError(ValueError):
    """A record does not match its schema."""


class RecordConflict(RuntimeError):
    """A write-once record already exists with different content."""


def make_id(kind: str, n: int) -> str:
    return f"{PREFIX[kind]}{n:04d}"


def id_number(rid: str) -> int:
    return int(rid[1:])


# ------------------------------------------------------------------------------------------------
# Records
# ------------------------------------------------------------------------------------------------
@dataclass
class Opportunity:
    """A search direction (not an exact edit): mechanism, where it should help, the evidence."""

    id: str
    step: int                                  # step whose lineage decision created it (0 = initialization)
    kind: OpportunityKind
    mechanism: str                             # e.g. "free knob PREFILL_WARPS 8 -> 4 (full-sequence only)"
    entry_points: list[str]                    # affected entry points, e.g. ["attention.prefill"]
    target_workloads: list[str]                # workloads expected to benefit, most important first
    evidence: list[str]                        # audit ids supporting it (failed attempts included)
    evidence_notes: str                        # the evidence in words (slowest workloads, failures...)
    applies_to: list[str]                      # verified implementation ids it may be applied to
    created_by: str                            # driver / agent name
    priority: float = 0.0                      # driver's ranking (higher first)
    details: dict[str, Any] = field(default_factory=dict)  # driver data, e.g. {"knob_moves": {...}}


@dataclass
class Implementation:
    """One complete source tree (never edited after creation)."""

    id: str
    step: int
    name: str                                  # manifest name (loader package name part)
    path: str                                  # folder, relative to the run directory
    origin: str                                # "root:<path it was copied from>" or "action:A0003"
    parents: list[str]                         # implementation ids ([] for the root)
    source_hash: str                           # loader.compute_source_hash of the folder ("" if not built)
    materialized: bool                         # False when the action's edits could not be applied
    target_arch: list[str]
    entry_points: dict[str, str]
    shared_regions: list[str]
    dispatch_rules: list[str]
    numerical_requirements: list[str]
    knobs: dict[str, Any]                      # knob name -> effective value (see edits.discover_knobs)
    files: list[str]                           # source files (relative)


@dataclass
class Action:
    """The exact source-code modification that produced an offspring."""

    id: str
    step: int
    opportunity: str
    parents: list[str]                         # verified implementation ids (first = the edited copy)
    offspring: str                             # implementation id created by this action
    kind: ActionKind                           # full-sequence-only, decode-only, or joint (paper §5.2)
    edits: list[dict[str, Any]]                # [{"op": "replace", "file", "search", "replace"} | {"op": "write",
                                               #   "file", "content"} | {"op": "delete", "file"}]
    diff: str                                  # unified diff parent[0] -> offspring ("" if not applicable)
    apply_error: Optional[str]                 # why the edits could not be applied (offspring not built)
    targeted_workloads: list[str]
    kernel_variants: list[str]                 # kernels / variants touched
    scope: str                                 # modification scope in words
    affected_regions: list[str]                # source regions touched (shared regions included)
    expected_effect: str                       # expected hardware effect
    numerical_risks: str                       # which numerical requirement could break
    falsifier: str                             # the measurement that would contradict the rationale
    created_by: str
    knob_moves: dict[str, Any] = field(default_factory=dict)
    llm: dict[str, Any] = field(default_factory=dict)   # model, attempts [{prompt_tokens, completion_tokens,
                                                        # estimated, error}], total_tokens
    wall_s: float = 0.0


@dataclass
class Audit:
    """Evaluator outcome for one implementation, plus the promotion / kappa update (RECORD AUDIT)."""

    id: str
    step: int
    implementation: str
    status: Status
    stage: str                                 # last stage reached: build|compile|bitwise|accuracy|latency|done
    verified: bool                             # compiled, ran, every correctness check passed
    fully_measured: bool                       # every workload of S has a latency
    admissible: bool                           # verified, fully measured, every workload within its limit
    objective_us: Optional[float]              # T(I) = sum_w c_w lat(I, w), when fully measured
    latencies_us: dict[str, float]
    limit_violations: list[str]
    checks: list[dict[str, Any]]               # bitwise / accuracy / dispatch / graph checks
    compile: dict[str, Any]                    # compiler evidence (registers, spills, shared memory...)
    dispatch: dict[str, Any]                   # observed kernel dispatch (own-code check, profiler names)
    timing: dict[str, Any]                     # per workload: method, both timing methods where measured
    error: Optional[str]
    log_tail: str
    hashes: dict[str, str]                     # candidate (before/loaded/after), spec, baseline, evaluator
    env: dict[str, Any]
    promoted: bool
    best_after: str                            # I*_{t+1}
    best_objective_after_us: Optional[float]
    kappa_after: int
    wall_s: float
    evaluated_at: str


@dataclass
class LineageDecision:
    """Lineage management after an audit: interpretation, branch status, follow-up opportunities."""

    id: str
    step: int
    audit: str
    implementation: str                        # the offspring the decision is about (root at step 0)
    decision: Decision
    interpretation: str                        # the agent's reading of the audit
    rationale: str
    new_opportunities: list[str]               # opportunity ids created with this decision
    closed_opportunities: list[str]            # pending opportunities dropped
    abandon: list[str]                         # retained implementations dropped from frontier/archive
    created_by: str


@dataclass
class Revocation:
    """A verdict found wrong later (a user's ``tik search revoke``, a failed re-audit or held-out check):
    the implementation (and, unless ``keep_descendants``, every offspring built from it) leaves the
    verified set, best and frontier / archive; the best is recomputed from the remaining records."""

    id: str
    after_step: int                            # takes effect after this step's decision (replay order)
    implementation: str
    reason: str
    source: str                                # "user" | "reaudit" | "heldout"
    evidence: dict[str, Any]                   # e.g. the failed re-audit's status / error / checks
    revoked: list[str]                         # the implementation and the descendants removed with it
    created_by: str
    created_at: str


RECORD_TYPES: dict[str, type] = {
    "opportunity": Opportunity,
    "implementation": Implementation,
    "action": Action,
    "audit": Audit,
    "decision": LineageDecision,
    "revocation": Revocation,
}
KIND_OF_TYPE = {v: k for k, v in RECORD_TYPES.items()}


# ------------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------------
def _check(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is typing.Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for a in inner:
            try:
                return _check(value, a, where)
            except SchemaError as e:
                errors.append(str(e))
        raise SchemaError("; ".join(errors))
    if origin is Literal:
        if value not in args:
            raise SchemaError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise SchemaError(f"{where}: expected a list, got {type(value).__name__}")
        return [_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SchemaError(f"{where}: expected an object, got {type(value).__name__}")
        for k in value:
            if not isinstance(k, str):
                raise SchemaError(f"{where}: keys must be strings, got {k!r}")
        return {k: _check(v, args[1], f"{where}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SchemaError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SchemaError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise SchemaError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise SchemaError(f"{where}: expected a string, got {value!r}")
        return value
    raise SchemaError(f"{where}: unsupported schema type {tp!r}")  # pragma: no cover


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def validate(kind: str, data: dict[str, Any]):
    """Build a record of ``kind`` from a JSON object, checking every field. Raises :class:`SchemaError`."""
    if kind not in RECORD_TYPES:
        raise SchemaError(f"unknown record kind {kind!r}; expected one of {list(RECORD_TYPES)}")
    cls = RECORD_TYPES[kind]
    if not isinstance(data, dict):
        raise SchemaError(f"{kind}: expected a JSON object")
    data = dict(data)
    schema = data.pop("schema", SCHEMA)
    if schema != SCHEMA:
        raise SchemaError(f"{kind}: schema {schema!r}, expected {SCHEMA!r}")
    dkind = data.pop("kind_of_record", kind)
    if dkind != kind:
        raise SchemaError(f"record is a {dkind!r}, expected {kind!r}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise SchemaError(f"{kind} {data.get('id', '?')}: unknown fields {unknown}")
    out = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                continue
            raise SchemaError(f"{kind} {data.get('id', '?')}: missing field {name!r}")
        out[name] = _check(data[name], hints[name], f"{kind}.{name}")
    rec = cls(**out)
    if not ID_PATTERNS[kind].match(rec.id):
        raise SchemaError(f"{kind}: id {rec.id!r} does not match {ID_PATTERNS[kind].pattern}")
    return rec


def to_json(rec) -> dict[str, Any]:
    kind = KIND_OF_TYPE[type(rec)]
    d = dataclasses.asdict(rec)
    validate(kind, d)  # never write what we could not read back
    return {"schema": SCHEMA, "kind_of_record": kind, **d}


# ------------------------------------------------------------------------------------------------
# Atomic files
# ------------------------------------------------------------------------------------------------
def atomic_write_text(path: str, text: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_json(path: str, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False, allow_nan=False) + "\n")


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def record_path(root: str, kind: str, rid: str) -> str:
    return os.path.join(root, "records", SUBDIR[kind], rid + ".json")


def write_record(root: str, rec) -> str:
    """Write a record once (identical rewrite is a no-op). Returns its path."""
    kind = KIND_OF_TYPE[type(rec)]
    path = record_path(root, kind, rec.id)
    data = to_json(rec)
    if os.path.exists(path):
        try:
            old = read_json(path)
        except (OSError, json.JSONDecodeError):
            old = None
        if old == json.loads(json.dumps(data)):
            return path
        raise RecordConflict(f"{kind} {rec.id} already exists at {path} with different content "
                             "(records are write-once)")
    atomic_write_json(path, data)
    return path


def load_record(root: str, kind: str, rid: str):
    path = record_path(root, kind, rid)
    try:
        data = read_json(path)
    except json.JSONDecodeError as e:
        raise SchemaError(f"{path}: invalid JSON ({e})") from e
    rec = validate(kind, data)
    if rec.id != rid:
        raise SchemaError(f"{path}: holds id {rec.id!r}")
    return rec


def list_ids(root: str, kind: str) -> list[str]:
    d = os.path.join(root, "records", SUBDIR[kind])
    if not os.path.isdir(d):
        return []
    out = []
    for fn in os.listdir(d):
        if fn.endswith(".json") and not fn.startswith("."):
            rid = fn[:-5]
            if not ID_PATTERNS[kind].match(rid):
                raise SchemaError(f"{os.path.join(d, fn)}: not a {kind} record name")
            out.append(rid)
    return sorted(out, key=id_number)


def load_all(root: str, kind: str) -> dict[str, Any]:
    return {rid: load_record(root, kind, rid) for rid in list_ids(root, kind)}


def remove_record(root: str, kind: str, rid: str) -> None:
    try:
        os.unlink(record_path(root, kind, rid))
    except FileNotFoundError:
        pass

"""LLM driver: source edits proposed by an OpenAI-compatible chat endpoint.

Endpoint from the environment: ``TIK_LLM_BASE_URL`` (or ``OPENAI_BASE_URL``, e.g.
``https://host/v1``), ``TIK_LLM_MODEL`` (or ``OPENAI_MODEL``), ``TIK_LLM_API_KEY`` (or
``OPENAI_API_KEY``; optional for local servers). Only the standard library is used (urllib).

ACTION: the highest-priority pending opportunity and its verified parent(s) are put in the prompt
with the records that matter -- the spec (workloads, weights, root latencies, limits), the numerical
requirements and shared regions of the manifest, the declared knobs (coupled vs free), the parent's
audit evidence, the lineage from the root, earlier attempts on the same opportunity (failures
included, with their errors) -- and the parent's source files. The reply is a JSON header (action
metadata + follow-up opportunities) and SEARCH/REPLACE blocks. A malformed reply or an edit that does
not apply is answered with the error and retried (``max_edit_retries``); tokens are counted from the
response's ``usage`` (or estimated at 4 characters a token, flagged ``estimated``).

LINEAGE MANAGEMENT (rules): promoted -> CONTINUE with the model's follow-ups (or a generic one);
verified but not promoted -> CONTINUE when the model named follow-ups (an intermediate worth
continuing), else ARCHIVE; failed -> RETRY from the same verified parent with the failure as evidence,
until ``max_failures`` failures on that opportunity chain, then ABANDON.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import urllib.error
import urllib.request
from typing import Any

from areal_tik_plugin.search import drivers as D
from areal_tik_plugin.search import edits as E
from areal_tik_plugin.search import ir


class LLMError(RuntimeError):
    """The endpoint could not be reached or answered with an error."""


# ------------------------------------------------------------------------------------------------
# client
# ------------------------------------------------------------------------------------------------
class ChatClient:
    """Minimal OpenAI-compatible ``/chat/completions`` client (urllib)."""

    def __init__(self, base_url: str | None = None, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = 600.0, http_retries: int = 3, temperature: float = 0.2,
                 max_tokens: int = 8192):
        self.base_url = (base_url or os.environ.get("TIK_LLM_BASE_URL") or os.environ.get("OPENAI_BASE_URL") or "").rstrip("/")
        self.model = model or os.environ.get("TIK_LLM_MODEL") or os.environ.get("OPENAI_MODEL") or ""
        self.api_key = api_key if api_key is not None else (os.environ.get("TIK_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY") or "")
        if not self.base_url or not self.model:
            raise LLMError("set TIK_LLM_BASE_URL (or OPENAI_BASE_URL) and TIK_LLM_MODEL (or OPENAI_MODEL)")
        self.timeout_s = timeout_s
        self.http_retries = http_retries
        self.temperature = temperature
        self.max_tokens = max_tokens

    def chat(self, messages: list[dict[str, str]]) -> tuple[str, dict[str, Any] | None]:
        url = self.base_url + ("" if self.base_url.endswith("/chat/completions") else "/chat/completions")
        body = json.dumps({"model": self.model, "messages": messages, "temperature": self.temperature,
                           "max_tokens": self.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last = None
        for attempt in range(self.http_retries + 1):
            req = urllib.request.Request(url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                    data = json.loads(r.read().decode())
                choice = (data.get("choices") or [{}])[0]
                text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
                return text, data.get("usage")
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:300]!r}"
                if e.code not in (408, 409, 429) and e.code < 500:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(min(30.0, 0.5 * 2 ** attempt))
        raise LLMError(f"chat endpoint {url} failed: {last}")


def estimate_tokens(text: str) -> int:
    return int(math.ceil(len(text) / 4.0))


# ------------------------------------------------------------------------------------------------
# prompt
# ------------------------------------------------------------------------------------------------
SYSTEM = """You are a GPU kernel engineer optimizing one implementation of unified kernels under a \
bitwise numerical contract. Its entry points (full-sequence and token-wise decode) must keep producing \
bit-identical results for the same token, while the weighted latency sum over the workloads falls.

Reply with exactly two parts:
1. A ```json block with the action record:
   {"kind": "full_sequence" | "decode" | "joint",
    "scope": "...", "targeted_workloads": ["..."], "kernel_variants": ["..."],
    "affected_regions": ["file:function"], "expected_effect": "hardware effect you expect",
    "numerical_risks": "which numerical requirement could break and why it should not",
    "falsifier": "the measurement that would show the idea is wrong",
    "followups": [{"mechanism": "...", "target_workloads": ["..."]}]}
2. One or more edit blocks, each exactly:
FILE: relative/path.py
<<<<<<< SEARCH
lines copied exactly from the current file
=======
replacement lines
>>>>>>> REPLACE

Rules: the SEARCH text must occur exactly once in the file as shown to you; do not edit manifest.json; \
constants in contract.py are coupled (every path reads them, so changing one moves all paths together); \
free knobs may differ per path but must not change any output bit; keep reduction orders, precision \
conversion points, exp/reciprocal instructions and rescaling order identical on every path unless you \
change them on every path together. Make one focused change per reply."""


def _fmt_workloads(run, lat: dict[str, float] | None) -> str:
    base = (run.spec.get("baseline") or {}).get("latencies_us", {})
    rows = ["| workload | entry | shape | c_w | root us | limit us | parent us |", "|---|---|---|---|---|---|---|"]
    for w in run.spec["workloads"]:
        r = base.get(w["name"])
        lim = r * w["max_slowdown"] if r else None
        p = (lat or {}).get(w["name"])
        rows.append(f"| {w['name']} | {w['entry']} | {json.dumps(w['shape'])} | {w['weight']:g} | "
                    f"{r and f'{r:.1f}'} | {lim and f'{lim:.1f}'} | {p and f'{p:.1f}'} |")
    return "\n".join(rows)


def _lineage(run, iid: str) -> list[str]:
    chain = []
    cur = iid
    while cur and cur != "I0000":
        a = run.actions[ir.make_id("action", ir.id_number(cur))]
        au = run.audits.get(ir.make_id("audit", a.step))
        chain.append(f"- {cur} <- {a.parents} by {a.id}: {run.opps[a.opportunity].mechanism} "
                     f"[{au.status if au else '?'}, T={au.objective_us if au else None}]")
        cur = a.parents[0]
    chain.append("- I0000: root")
    return list(reversed(chain))


def _attempts(run, opp: ir.Opportunity, parent: str) -> list[str]:
    chain_root = opp.details.get("retry_of") or opp.id
    out = []
    for a in run.actions.values():
        o = run.opps[a.opportunity]
        same_chain = (o.details.get("retry_of") or o.id) == chain_root
        if not same_chain and parent not in a.parents:
            continue
        au = run.audits.get(ir.make_id("audit", a.step))
        status = au.status if au else "not audited"
        err = ((au.error if au else "") or a.apply_error or "")[:600]
        out.append(f"### {a.id} on {a.parents} ({o.mechanism}) -> {status}"
                   + (f", T={au.objective_us:.1f}us" if au and au.objective_us else "")
                   + (f", limit violations {au.limit_violations}" if au and au.limit_violations else "")
                   + (f"\nerror: {err}" if err else "")
                   + f"\ndiff:\n```diff\n{a.diff[:2500]}\n```")
    return out[-6:]


def build_messages(run, opp: ir.Opportunity, parents: list[str], max_file_chars: int = 80000) -> list[dict[str, str]]:
    parent = parents[0]
    rec = run.impls[parent]
    audit = D.audit_of(run, parent)
    knobs = run.knobs_of(parent)
    st = run.state()
    parts = [
        f"# Evaluation specification `{run.spec['name']}` ({run.spec['target']})",
        "Promotion: verified (compiles, every bitwise and accuracy check passes), every workload measured and "
        "within its limit, and strictly lower T = sum_w c_w * latency_w than the current best "
        f"{st.best} (T = {st.best_objective_us:.1f} us; root T = {run.audits['E0000'].objective_us:.1f} us).",
        _fmt_workloads(run, audit.latencies_us),
        "Bitwise suites: " + ", ".join(s["suite"] for s in run.spec.get("bitwise", [])),
        "Accuracy: " + ", ".join(f"{c['suite']} (atol {c.get('atol')}, rtol {c.get('rtol')})"
                                 for c in run.spec.get("accuracy", [])),
        "# Numerical requirements (manifest)", *[f"- {x}" for x in rec.numerical_requirements],
        "# Shared source regions", *[f"- {x}" for x in rec.shared_regions],
        "# Knobs", *[f"- {n} = {k.value!r} ({'coupled, contract.py' if k.coupled else 'free, ' + k.file}; "
                     f"choices {list(k.choices)})" for n, k in sorted(knobs.items())],
        f"# Opportunity {opp.id} ({opp.kind})",
        f"mechanism: {opp.mechanism}", f"entry points: {opp.entry_points}",
        f"target workloads: {opp.target_workloads}", f"evidence: {opp.evidence} {opp.evidence_notes}",
        f"# Parent {parent} (audit {audit.id}: {audit.status}, T={audit.objective_us})", *_lineage(run, parent),
    ]
    if len(parents) > 1:
        other = parents[1]
        a = run.actions.get(ir.make_id("action", ir.id_number(other)))
        parts += [f"# Merge: also bring in the change of {other}", f"```diff\n{a.diff[:6000] if a else ''}\n```"]
    att = _attempts(run, opp, parent)
    if att:
        parts += ["# Earlier attempts (negative evidence included)", *att]
    parts.append(f"# Source files of {parent} (edit these; paths are relative)")
    used = 0
    files = run.files_of(parent)
    mods = set(run.knob_modules({"entry_points": rec.entry_points}))
    order = sorted(files, key=lambda r: (os.path.basename(r) != "contract.py", r not in mods, r))
    for rel in order:
        text = files[rel]
        if used + len(text) > max_file_chars:
            parts.append(f"(file {rel} omitted: prompt size limit)")
            continue
        used += len(text)
        parts.append(f"FILE {rel}\n```python\n{text}\n```")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


_JSON = re.compile(r"```json\s*\n(.*?)\n```", re.S)


def parse_reply(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, edits); raises :class:`edits.EditError` when the reply is malformed."""
    m = _JSON.search(text)
    if not m:
        raise E.EditError("the reply has no ```json block with the action record")
    try:
        header = json.loads(m.group(1))
    except json.JSONDecodeError as e:
        raise E.EditError(f"the ```json block is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise E.EditError("the ```json block must be an object")
    edits = E.parse_search_replace(text[m.end():] if "<<<<<<< SEARCH" in text[m.end():] else text)
    if not edits:
        raise E.EditError("the reply has no SEARCH/REPLACE edit block")
    return header, edits


def _strs(x: Any) -> list[str]:
    return [str(v) for v in x] if isinstance(x, list) else ([str(x)] if x else [])


# ------------------------------------------------------------------------------------------------
# driver
# ------------------------------------------------------------------------------------------------
class LLMDriver:
    name = "llm"

    def __init__(self, client: ChatClient | None = None, max_edit_retries: int = 2, max_failures: int = 2,
                 max_file_chars: int = 80000):
        self.client = client or ChatClient()
        self.max_edit_retries = max_edit_retries
        self.max_failures = max_failures
        self.max_file_chars = max_file_chars

    def initial_decision(self, run) -> ir.LineageDecision:
        au = run.audits["E0000"]
        shares = D.workload_shares(run, au.latencies_us)
        opps = []
        for kind in ("full_sequence", "decode", "train_fwd_bwd"):
            eps = [e for e, k in run.spec["entry_points"].items() if k == kind]
            if not eps:
                continue
            targets = sorted(D.workloads_of(run, eps), key=lambda n: -shares.get(n, 0.0))
            share = sum(shares.get(n, 0.0) for n in targets)
            opps.append({
                "kind": "initial",
                "mechanism": f"reduce the latency of the {kind.replace('_', '-')} entry points {eps} "
                             f"(they hold {100 * share:.1f}% of T(I0))",
                "entry_points": eps, "target_workloads": targets, "evidence": ["E0000"],
                "evidence_notes": "largest workloads: " + D.slowest_note(run, au.latencies_us, targets),
                "applies_to": ["I0000"], "priority": round(share, 6), "details": {},
            })
        return run.decide(decision="CONTINUE", interpretation=f"root verified, T={au.objective_us:.1f}us",
                          rationale="one opportunity per entry-point kind, ranked by its share of T",
                          new_opportunities=opps, created_by=self.name)

    def act(self, run) -> ir.Action:
        t0 = time.time()
        opp = D.pending_sorted(run)[0]
        parents = list(opp.applies_to[:2] if opp.kind == "merge" else opp.applies_to[:1])
        messages = build_messages(run, opp, parents, self.max_file_chars)
        parent_files = run.files_of(parents[0])
        attempts = []
        header: dict[str, Any] = {}
        edits: list[dict[str, Any]] = []
        error = None
        for attempt in range(self.max_edit_retries + 1):
            text, usage = self.client.chat(messages)
            if usage and isinstance(usage.get("prompt_tokens"), int):
                pt, ct, est = usage["prompt_tokens"], int(usage.get("completion_tokens") or 0), False
            else:
                pt = sum(estimate_tokens(m["content"]) for m in messages)
                ct, est = estimate_tokens(text), True
            rec = {"prompt_tokens": pt, "completion_tokens": ct, "estimated": est, "error": None}
            attempts.append(rec)
            try:
                header, edits = parse_reply(text)
                E.apply_edits(parent_files, edits)
                error = None
                break
            except E.EditError as e:
                error = str(e)
                rec["error"] = error[:500]
                messages = messages + [
                    {"role": "assistant", "content": text},
                    {"role": "user", "content": f"Your reply could not be applied: {error}\nReply again with the "
                                                "complete response (json block + SEARCH/REPLACE blocks); copy "
                                                "SEARCH lines exactly from the files shown."},
                ]
        total = sum(a["prompt_tokens"] + a["completion_tokens"] for a in attempts)
        kind = header.get("kind") if header.get("kind") in ("full_sequence", "decode", "joint") else \
            D.action_kind(run, opp.entry_points)
        followups = [f for f in header.get("followups", []) if isinstance(f, dict) and f.get("mechanism")] \
            if isinstance(header.get("followups"), list) else []
        return run.record_action(
            opportunity=opp.id, parents=parents, edits=edits, kind=kind,
            targeted_workloads=[w for w in _strs(header.get("targeted_workloads"))
                                if w in {x["name"] for x in run.spec["workloads"]}] or opp.target_workloads,
            kernel_variants=_strs(header.get("kernel_variants")), scope=str(header.get("scope", ""))[:2000],
            affected_regions=_strs(header.get("affected_regions")),
            expected_effect=str(header.get("expected_effect", ""))[:2000],
            numerical_risks=str(header.get("numerical_risks", ""))[:2000],
            falsifier=str(header.get("falsifier", ""))[:2000], created_by=self.name,
            llm={"model": self.client.model, "attempts": attempts, "total_tokens": total, "followups": followups[:5]},
            apply_error=error, wall_s=time.time() - t0)

    def decide(self, run) -> ir.LineageDecision:
        st = run.state()
        step = st.open_step
        action = run.actions[ir.make_id("action", step)]
        audit = run.audits[ir.make_id("audit", step)]
        opp = run.opps[action.opportunity]
        off = audit.implementation
        if not audit.verified:
            chain = opp.details.get("retry_of") or opp.id
            failures = 0
            for a in run.actions.values():
                au = run.audits.get(ir.make_id("audit", a.step))
                if au is not None and not au.verified and \
                        (run.opps[a.opportunity].details.get("retry_of") or a.opportunity) == chain:
                    failures += 1
            interp = f"{off} failed: {audit.status} at stage {audit.stage}: {(audit.error or '')[:300]}"
            if failures < self.max_failures:
                return run.decide(
                    decision="RETRY", interpretation=interp,
                    rationale=f"failure {failures}/{self.max_failures} on this opportunity; retry from the verified "
                              f"parent {action.parents[0]} with the failure as evidence",
                    new_opportunities=[{
                        "kind": "retry", "mechanism": f"retry ({failures + 1}): {run.opps[chain].mechanism}",
                        "entry_points": opp.entry_points, "target_workloads": opp.target_workloads,
                        "evidence": sorted(set(opp.evidence) | {audit.id}),
                        "evidence_notes": f"{action.id} failed with {audit.status}: {(audit.error or '')[:300]}",
                        "applies_to": list(action.parents), "priority": opp.priority,
                        "details": {"retry_of": chain, "attempt": failures + 1}}],
                    created_by=self.name)
            return run.decide(decision="ABANDON", interpretation=interp,
                              rationale=f"{failures} failed attempts on {chain}; direction abandoned, the attempts "
                                        "stay as negative evidence", created_by=self.name)
        followups = action.llm.get("followups") or []
        names = {w["name"] for w in run.spec["workloads"]}
        base_prio = 3.0 if audit.promoted else 2.0
        opps = [{
            "kind": "followup", "mechanism": str(f["mechanism"])[:1000],
            "entry_points": [e for e in _strs(f.get("entry_points")) if e in run.spec["entry_points"]] or opp.entry_points,
            "target_workloads": [w for w in _strs(f.get("target_workloads")) if w in names] or action.targeted_workloads,
            "evidence": [audit.id], "evidence_notes": f"proposed with {action.id}; {audit.id}: T={audit.objective_us}",
            "applies_to": [off], "priority": base_prio, "details": {}} for f in followups]
        if audit.promoted:
            if not opps:
                opps = [{"kind": "followup", "mechanism": f"continue: {opp.mechanism}", "entry_points": opp.entry_points,
                         "target_workloads": action.targeted_workloads, "evidence": [audit.id],
                         "evidence_notes": f"{off} promoted", "applies_to": [off], "priority": base_prio,
                         "details": {}}]
            return run.decide(decision="CONTINUE", interpretation=f"{off} promoted: T={audit.objective_us:.1f}us",
                              rationale="continue from the new best", new_opportunities=opps, created_by=self.name)
        why = (f"limit violations {audit.limit_violations}" if audit.limit_violations
               else f"T={audit.objective_us:.1f}us not below the best {st.best_objective_us:.1f}us")
        if opps:
            return run.decide(decision="CONTINUE", interpretation=f"{off} verified, not promoted ({why})",
                              rationale="verified intermediate with follow-up opportunities: keep it on the frontier",
                              new_opportunities=opps, created_by=self.name)
        return run.decide(decision="ARCHIVE", interpretation=f"{off} verified, not promoted ({why})",
                          rationale="no immediate follow-up; retained for reuse", created_by=self.name)

"""LLM driver end to end against a local fake OpenAI-compatible server replaying scripted replies.

Each candidate runs in its own process through the real evaluator (CPU toy implementation):
a good edit (after one edit that does not apply), a candidate that crashes, one that hangs (killed by
the wall-clock limit), one that breaks the bits, one that is faster overall but beyond one workload's
limit (kept as a verified intermediate), and one that is inaccurate. Checks: promotion rule, kappa,
branch decisions, retries, tokens, and that no failure is ever promoted or used as a parent.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from areal_tik_plugin.search import SPECS_DIR, TESTDATA_DIR, ir
from areal_tik_plugin.search.drivers.llm import ChatClient, LLMDriver, parse_reply
from areal_tik_plugin.search.engine import run_search
from areal_tik_plugin.search.evaluator import Evaluator
from areal_tik_plugin.search.state import Run

TOY = os.path.join(TESTDATA_DIR, "toy_v1")

HEADER = {"kind": "joint", "scope": "toy.py", "expected_effect": "fewer Python iterations",
          "numerical_risks": "none: free knobs only", "falsifier": "full_T96 not faster"}


def reply(edits, header=None, **extra):
    h = dict(HEADER, **(header or {}))
    h.update(extra)
    text = "Plan: see the record.\n```json\n" + json.dumps(h) + "\n```\n"
    for f, s, r in edits:
        text += f"FILE: {f}\n<<<<<<< SEARCH\n{s}=======\n{r}>>>>>>> REPLACE\n"
    return text


ROW1 = "ROW_BLOCK = 1    # free: query rows per block in full()\n"
STEP1 = "STEP_BLOCK = 1   # free: requests per block in step()\n"
B_LINE = "    B = q.shape[0]\n"
OUT_LINE = "        out[b0:b1] = _reduce(w, v[b0:b1, :hi], hi)\n"
RET_LINE = "    return acc / den[:, None]\n"

SCRIPT = [
    # step 1 (O0001 full-sequence, parent I0000): an edit that does not apply, then the good edit
    (reply([("toy.py", "ROW_BLOCK = 2\n", "ROW_BLOCK = 4\n")]), {"prompt_tokens": 1000, "completion_tokens": 50}),
    (reply([("toy.py", ROW1, ROW1.replace("= 1", "= 4"))],
           followups=[{"mechanism": "process step requests in blocks", "target_workloads": ["step_b4_ctx96"]}]),
     {"prompt_tokens": 1200, "completion_tokens": 60}),
    # step 2 (follow-up on I0001): crashes (SIGSEGV) as soon as a batch has more than one request
    (reply([("toy.py", B_LINE, B_LINE + "    if B > 1:\n        import os, signal\n"
                                        "        os.kill(os.getpid(), signal.SIGSEGV)\n")]),
     {"prompt_tokens": 1500, "completion_tokens": 70}),
    # step 3 (retry on I0001): hangs
    (reply([("toy.py", B_LINE, B_LINE + "    if B > 1:\n        import time\n        time.sleep(3600)\n")]),
     None),  # no usage: tokens are estimated
    # step 4 (O0002 decode, parent I0000): breaks the bits of the step path only
    (reply([("toy.py", OUT_LINE, OUT_LINE.replace("hi)\n", "hi) * (1.0 + 2.0 ** -20)\n"))], {"kind": "decode"}),
     {"prompt_tokens": 900, "completion_tokens": 40}),
    # step 5 (retry on I0000): much faster in total, but one workload far beyond its limit
    (reply([("toy.py", ROW1, ROW1.replace("= 1", "= 64")), ("toy.py", STEP1, STEP1.replace("= 1", "= 16")),
            ("toy.py", B_LINE, B_LINE + "    if B == 1 and int(ctx[0]) == 48:\n        import time\n"
                                        "        time.sleep(0.01)\n")],
           followups=[{"mechanism": "remove the per-request stall", "target_workloads": ["step_b1_ctx48"]}]),
     {"prompt_tokens": 1100, "completion_tokens": 90}),
    # step 6 (follow-up on the verified intermediate I0005): accurate bits-equal but inaccurate
    (reply([("toy.py", RET_LINE, "    return acc / den[:, None] + 1e-3\n")]),
     {"prompt_tokens": 1300, "completion_tokens": 30}),
]


class FakeOpenAI:
    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                if not outer.script:
                    self.send_response(500)
                    self.end_headers()
                    return
                text, usage = outer.script.pop(0)
                data = {"id": "x", "object": "chat.completion",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}
                if usage:
                    data["usage"] = dict(usage, total_tokens=usage["prompt_tokens"] + usage["completion_tokens"])
                raw = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *a):
        self.server.shutdown()
        self.server.server_close()


def llm_spec(tmp_path):
    with open(os.path.join(SPECS_DIR, "cpu_toy.yaml")) as f:
        s = yaml.safe_load(f)
    s["max_slowdown"] = 3.0  # shared CI machine: wide limits; the scripted violation is far beyond
    s["workloads"][1]["weight"] = 4.0  # full_T96 dominates T
    s["evaluation"]["timeout_s"] = 20
    s["search"].update(kappa_max=5, max_steps=20, time_budget_s=None)
    p = os.path.join(str(tmp_path), "spec.yaml")
    with open(p, "w") as f:
        yaml.safe_dump(s, f)
    return p


def test_parse_reply_errors():
    with pytest.raises(Exception, match="json"):
        parse_reply("no header")
    with pytest.raises(Exception, match="no SEARCH/REPLACE"):
        parse_reply("```json\n{}\n```\n")
    h, e = parse_reply(SCRIPT[1][0])
    assert h["followups"] and e[0]["file"] == "toy.py"


def test_llm_driver_scripted(tmp_path):
    run = Run.create(os.path.join(str(tmp_path), "run"), llm_spec(tmp_path), TOY)
    with FakeOpenAI(SCRIPT) as srv:
        client = ChatClient(base_url=srv.url, model="fake-model", api_key="k-test", http_retries=0)
        s = run_search(run, LLMDriver(client, max_edit_retries=2, max_failures=2), Evaluator())
    st = run.state()
    statuses = [run.audits[ir.make_id("audit", i)].status for i in range(1, 7)]
    assert statuses == ["ok", "runtime_error", "timeout", "contract_violation", "ok", "inaccurate"], statuses
    a = {i: run.audits[ir.make_id("audit", i)] for i in range(0, 7)}
    # promotion: only the good edit; the faster-overall candidate violates one workload's limit
    assert [i for i in a if a[i].promoted] == [0, 1]
    assert st.best == "I0001"
    assert a[5].verified and a[5].objective_us < a[1].objective_us and not a[5].admissible
    assert a[5].limit_violations == ["step_b1_ctx48"]
    assert [a[i].kappa_after for i in range(1, 7)] == [0, 1, 2, 3, 4, 5]
    assert "kappa" in s["stopped"]["reason"] and s["steps"] == 6
    # crash / hang diagnostics
    assert "signal" in a[2].error and a[2].stage == "bitwise"
    assert "wall-clock limit" in a[3].error
    # branch decisions
    d = {i: run.decisions[ir.make_id("decision", i)].decision for i in range(1, 7)}
    assert d == {1: "CONTINUE", 2: "RETRY", 3: "ABANDON", 4: "RETRY", 5: "CONTINUE", 6: "RETRY"}
    acts = {i: run.actions[ir.make_id("action", i)] for i in range(1, 7)}
    assert [acts[i].parents for i in range(1, 7)] == [["I0000"], ["I0001"], ["I0001"], ["I0000"], ["I0000"],
                                                      ["I0005"]]
    failed = {f"I000{i}" for i in (2, 3, 4, 6)}
    for act in run.actions.values():
        assert not set(act.parents) & failed
    for o in run.opps.values():
        assert not set(o.applies_to) & failed
    assert not (set(st.frontier(run.opps)) | set(st.archive(run.opps))) & failed
    assert "I0005" in st.retained  # verified non-best intermediate kept and continued
    # the edit that did not apply was retried with the error; tokens counted, estimated when no usage
    att = acts[1].llm["attempts"]
    assert len(att) == 2 and "not found" in att[0]["error"] and att[1]["error"] is None
    assert acts[3].llm["attempts"][0]["estimated"] and acts[3].llm["total_tokens"] > 0
    assert st.tokens == sum(x.llm["total_tokens"] for x in run.actions.values())
    assert st.tokens > 1000 + 50 + 1200 + 60 + 1500 + 70 + 900 + 40 + 1100 + 90 + 1300 + 30
    # what the model was shown: requirements, evidence of the earlier failure, the retry message
    reqs = [r["body"] for r in srv.requests]
    assert len(reqs) == 7 and all(r["model"] == "fake-model" for r in reqs)
    assert srv.requests[0]["auth"] == "Bearer k-test"
    first = reqs[0]["messages"][1]["content"]
    assert "every row of full() equals step()" in first and "TOY_CHUNK" in first and "FILE toy.py" in first
    assert "could not be applied" in reqs[1]["messages"][-1]["content"]
    assert "runtime_error" in reqs[3]["messages"][1]["content"]  # the retry saw the crash as evidence
    assert "I0005" in reqs[6]["messages"][1]["content"]
    # the run directory reopens to the same state (resume is exact)
    run.close()
    again = Run.open(run.root)
    assert again.state().history == st.history and again.phase() == "done"

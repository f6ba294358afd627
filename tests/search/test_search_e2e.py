"""`tik search` end to end with the real process-isolated evaluator (CPU).

* knob driver through the CLI, interrupted by SIGINT in the middle of a candidate's evaluation (the
  candidate's process group must die), then resumed to completion, then the report;
* the agent protocol: init -> next -> checkout/record-action -> audit -> decide, with its rule errors;
* the attention runner on a copy of the real tik_v1 kernels under the Triton interpreter (root audit
  plus one coupled-knob offspring).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import yaml

from areal_tik_plugin.cli import main
from areal_tik_plugin.search import SPECS_DIR, TESTDATA_DIR, ir
from areal_tik_plugin.search.state import Run

TOY = os.path.join(TESTDATA_DIR, "toy_v1")


def toy_spec(tmp_path, **search):
    with open(os.path.join(SPECS_DIR, "cpu_toy.yaml")) as f:
        s = yaml.safe_load(f)
    s["max_slowdown"] = 3.0
    s["workloads"] = s["workloads"][:4]
    s["search"].update(search)
    p = os.path.join(str(tmp_path), "spec.yaml")
    with open(p, "w") as f:
        yaml.safe_dump(s, f)
    return p


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def test_knobs_cli_sigint_resume_report(tmp_path):
    d = os.path.join(str(tmp_path), "run")
    cmd = [sys.executable, "-m", "areal_tik_plugin.cli", "search", "run", "--driver", "knobs",
           "--spec", toy_spec(tmp_path, kappa_max=10), "--impl", TOY, "--run-dir", d, "--max-steps", "2"]
    # A background shell (CI) starts us with SIGINT ignored, and Python then installs no KeyboardInterrupt
    # handler in the child: give the child the default disposition so it behaves as under a terminal.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pid_file = os.path.join(d, "work", "I0001.pid")
    t0 = time.time()
    while not os.path.exists(pid_file) and time.time() - t0 < 120 and proc.poll() is None:
        time.sleep(0.1)
    assert os.path.exists(pid_file), proc.communicate()[0]
    time.sleep(1.0)
    with open(pid_file) as f:
        worker = int(f.read())
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "resume" in out
    assert not _alive(worker), "the candidate's process group must be killed on Ctrl-C"
    run = Run.open(d, lock=False)
    assert run.phase() == "audit" and "A0001" in run.actions and "E0001" not in run.audits
    a1 = ir.to_json(run.actions["A0001"])
    # resume in this process, to the step budget, then the report
    assert main(["search", "run", "--driver", "knobs", "--run-dir", d, "--no-progress", "--report"]) == 0
    run = Run.open(d, lock=False)
    assert ir.to_json(run.actions["A0001"]) == a1  # the interrupted step continued, not redone
    st = run.state()
    assert st.t == 2 and [h["step"] for h in st.history] == [0, 1, 2]
    assert all(run.audits[ir.make_id("audit", i)].status == "ok" for i in range(3))
    assert "step budget" in run.meta["stopped"]["reason"]
    rep = os.path.join(d, "report")
    for f in ("report.md", "speedup.png", "graph.png"):
        assert os.path.getsize(os.path.join(rep, f)) > 0
    md = open(os.path.join(rep, "report.md")).read()
    assert "## Workloads" in md and "full_T48" in md
    # the audit records carry hash binding and environment
    e = run.audits["E0001"]
    assert e.hashes["candidate_before"] == e.hashes["candidate_after"] == e.hashes["worker_candidate_loaded"]
    assert e.hashes["evaluator_before"] == run.meta["evaluator_hash"] == e.hashes["worker_evaluator"]
    assert e.env["torch"] and e.env["device"] == "cpu"
    assert any(c["name"] == "own_code" and c["passed"] for c in e.checks)


def test_agent_protocol(tmp_path, capsys):
    d = os.path.join(str(tmp_path), "run")
    opps = os.path.join(str(tmp_path), "opps.json")
    with open(opps, "w") as f:
        json.dump([{"mechanism": "process full-sequence rows in blocks", "entry_points": ["toy.full"],
                    "target_workloads": ["full_T96", "full_T48"], "applies_to": ["I0000"], "priority": 1.0}], f)
    assert main(["search", "init", "--spec", toy_spec(tmp_path, kappa_max=4), "--impl", TOY, "--run-dir", d,
                 "--opportunities", opps, "--created-by", "test-agent"]) == 0
    nxt = json.loads(capsys.readouterr().out.split("initial opportunities recorded\n", 1)[1])
    assert nxt["phase"] == "action" and nxt["pending"][0]["id"] == "O0001"
    # Action: edit a checked-out copy, record it
    work = os.path.join(str(tmp_path), "work")
    assert main(["search", "checkout", d, "I0000", work]) == 0
    p = os.path.join(work, "toy.py")
    src = open(p).read()
    with open(p, "w") as f:
        f.write(src.replace("ROW_BLOCK = 1 ", "ROW_BLOCK = 16", 1))
    assert main(["search", "record-action", d, "--opportunity", "O0001", "--parents", "I0000", "--from-dir", work,
                 "--kind", "full_sequence", "--expected-effect", "16x fewer row iterations",
                 "--numerical-risks", "none (free knob)", "--falsifier", "full_T96 not faster",
                 "--created-by", "test-agent", "--tokens", "1234"]) == 0
    assert "+ROW_BLOCK = 16" in capsys.readouterr().out
    assert main(["search", "decide", d, "--decision", "CONTINUE", "--interpretation", "x", "--rationale", "y"]) == 2
    assert main(["search", "audit", d, "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["status"] == "ok" and res["promoted"] and res["kappa"] == 0
    # Lineage: CONTINUE needs a follow-up on the offspring
    assert main(["search", "decide", d, "--decision", "CONTINUE", "--interpretation", "promoted",
                 "--rationale", "continue"]) == 2
    fol = os.path.join(str(tmp_path), "fol.yaml")
    with open(fol, "w") as f:
        yaml.safe_dump([{"mechanism": "change the step path", "entry_points": ["toy.step"], "applies_to": ["I0001"]}], f)
    assert main(["search", "decide", d, "--decision", "CONTINUE", "--interpretation", "promoted",
                 "--rationale", "continue", "--opportunities", fol]) == 0
    capsys.readouterr()
    # an edit file in SEARCH/REPLACE form that breaks the bits of the step path
    ed = os.path.join(str(tmp_path), "edit.txt")
    line = "        out[b0:b1] = _reduce(w, v[b0:b1, :hi], hi)\n"
    with open(ed, "w") as f:
        f.write(f"FILE: toy.py\n<<<<<<< SEARCH\n{line}=======\n{line[:-1]} * 1.0000001\n>>>>>>> REPLACE\n")
    assert main(["search", "record-action", d, "--opportunity", "O0002", "--parents", "I0001", "--edits", ed,
                 "--kind", "decode"]) == 0
    capsys.readouterr()
    assert main(["search", "audit", d, "--no-progress"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["status"] == "contract_violation" and not res["promoted"] and res["kappa"] == 1
    assert main(["search", "decide", d, "--decision", "ARCHIVE", "--interpretation", "bits", "--rationale", "r"]) == 2
    assert main(["search", "decide", d, "--decision", "ABANDON", "--interpretation", "bits broken",
                 "--rationale", "rescaling changed on one path only"]) == 0
    capsys.readouterr()
    assert main(["search", "status", d, "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["best"] == "I0001" and st["kappa"] == 1 and st["phase"] == "done"  # no pending opportunity left
    assert main(["search", "show", d, "A0001"]) == 0
    a = json.loads(capsys.readouterr().out)
    assert a["created_by"] == "test-agent" and a["llm"]["total_tokens"] == 1234 and a["kind"] == "full_sequence"
    assert main(["search", "report", d]) == 0


def test_attention_runner_on_tik_v1_interpreter(knob_run_on_tik_v1):
    run = knob_run_on_tik_v1("cpu_attention_smoke", 1)
    e0, e1 = run.audits["E0000"], run.audits["E0001"]
    assert e0.status == "ok", e0.error
    names = {c["name"] for c in e0.checks}
    assert {"prefix_rows[P=270,A=5]", "decode_rows[P=270,A=5,page=16]", "batched_vs_single_decode[B=3]",
            "varlen_vs_fp32[[1, 17, 70]]"} <= names
    a1 = run.actions["A0001"]
    assert a1.knob_moves and set(a1.knob_moves) <= {"ATTN_KV_TILE", "ATTN_SPLIT_KV"}  # coupled first
    assert {e["file"] for e in a1.edits} == {"contract.py"}
    assert e1.status == "ok", e1.error  # moving a coupled constant keeps every path equal

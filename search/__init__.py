"""Kernel search: the AReaL-TIK optimization IR as typed code (installed as ``areal_tik_plugin.search``).

Modules
-------
``ir``         the five record kinds (opportunity, implementation, action, audit, lineage decision),
               schema validation, atomic one-file-per-record storage
``spec``       the evaluation specification S (YAML per GPU), frozen per run, hashed
``state``      the run directory and the search state Z_t = <S, G_t, F_t, R_t, O_t, I*_t, kappa_t>,
               derived by replaying the records (so a run resumes exactly), promotion rule (paper §5.3)
``edits``      SEARCH/REPLACE edits, knob discovery and knob edits (coupled vs free)
``evaluator``  one isolated process per candidate (``worker``), A/B timing on fresh inputs, typed
               status, hash binding
``sandbox``    static source check, scrubbed environment, limits, network namespace, process hunt,
               integrity snapshot of the run directory
``instructions`` per-path instruction evidence and the contract rule over it
``export``     a verified implementation as an installable folder with its audits as evidence
``runners``    workload runners: ``attention`` and ``gemm`` (the real entry points, GPU or Triton
               interpreter), ``toy`` (a small pure-torch implementation for CPU tests)
``drivers``    ``knobs`` (no LLM), ``llm`` (OpenAI-compatible endpoint); the ``agent`` driver is the
               command line (``tik search init|next|record-action|audit|decide|status|report``)
               plus ``skill/SKILL.md``
``report``     markdown + PNG plots of a run
``cli``        ``tik search ...``
"""

import os

SEARCH_DIR = os.path.dirname(os.path.abspath(__file__))
SPECS_DIR = os.path.join(SEARCH_DIR, "specs")
TESTDATA_DIR = os.path.join(SEARCH_DIR, "testdata")

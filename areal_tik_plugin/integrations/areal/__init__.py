"""AReaL integration: run an existing AReaL job on the unified kernels and stop recomputing log-probs.

One change switches a job over: launch the same entry script through the wrapper and add
``tik.*`` overrides (``tik.enable=true`` is the default under the wrapper)::

    python -m areal_tik_plugin.run examples/math/gsm8k_rl.py --config my.yaml scheduler.type=local
    torchrun --nproc-per-node N -m areal_tik_plugin.run examples/math/gsm8k_rl.py --config my.yaml ...

Pieces (AReaL/SGLang are imported inside functions; this package imports with torch only):

- :mod:`.config`   -- the ``tik`` section, validation (refusals) and the recompute plan;
- :mod:`.hooks`    -- patches installed in the trainer / every AReaL worker process;
- :mod:`.monitor`  -- the runtime bitwise mismatch monitor;
- :mod:`.sglang_cmd` -- the SGLang server command (AReaL 1.0.4's launcher targets SGLang 0.5.10);
- :mod:`.stats`    -- throughput, per-phase times and the JSONL stats log read by ``tik compare``;
- :mod:`.worker`   -- ``python -m areal_tik_plugin.integrations.areal.worker``: AReaL's RPC worker
  with the hooks installed (single-controller mode);
- :mod:`.tiny`, :mod:`.testing` -- tiny checkpoints and helpers for CPU end-to-end tests.
"""

ENV_VAR = "AREAL_TIK_CONFIG"  # base64(JSON) of the resolved tik section, read by every worker

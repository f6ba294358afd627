"""The ``tik`` config section, the checks that refuse invalid reuse, and the recompute plan.

Everything here works on AReaL's config objects by attribute access (``cfg.actor.recompute_logprob``
...), so it is tested with AReaL's real dataclasses and with plain namespaces alike, and imports
neither AReaL nor SGLang.

Recompute plan (staleness ``s = rollout.max_head_offpolicyness``):

==========================  ====================================================================
``s == 0``                  rollout log-probs are the old *and* the proximal log-probs:
                            ``actor.recompute_logprob=false``, ``actor.use_decoupled_loss=false``;
                            no recompute forward (mode ``reuse``)
``s > 0``, ``prox_mode=     the decoupled loss keeps a proximal policy the behaviour log-probs
recompute`` (default)       cannot replace: the forward runs for the proximal term only; the
                            behaviour log-probs (exact under the plugin) still weight the loss
                            (mode ``recompute-prox``)
``s > 0``, ``prox_mode=     AReaL's log-linear proximal approximation, no forward pass:
loglinear``                 ``recompute_logprob=false``, ``use_decoupled_loss=true``,
                            ``prox_logp_method=loglinear`` (mode ``loglinear``); needs
                            ``actor.rejection_sampling`` so that the behaviour importance weight
                            is applied -- refused otherwise, never dropped silently
==========================  ====================================================================
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from . import ENV_VAR

PROX_MODES = ("recompute", "loglinear")
ON_MISMATCH = ("fallback", "raise", "warn")
# model families the transformers integration patches (areal_tik_plugin.integrations.transformers.FAMILIES)
DEFAULT_FAMILIES = ("qwen2", "qwen3", "qwen3_moe", "llama")
WORKER_MODULE = "areal_tik_plugin.integrations.areal.worker"
_TOPK_OFF = 10**8  # AReaL's GenerationHyperparameters.top_k default (int(1e8)) means "no top-k"


class TikConfigError(ValueError):
    """A configuration under which rollout log-probs cannot be reused."""


@dataclass
class TikConfig:
    """The ``tik`` section (``tik.<name>=value`` overrides on the AReaL command line)."""

    enable: bool = True
    # staleness > 0: how the proximal policy of the decoupled loss is obtained
    prox_mode: str = "recompute"
    # runtime mismatch monitor: every N train steps (0 = off), on this many sequences
    monitor_every: int = 10
    monitor_samples: int = 2
    on_mismatch: str = "fallback"
    # rollout tensor-parallel sizes verified bitwise against the training forward
    verified_rollout_tp: list = field(default_factory=lambda: [1])
    # SGLang server (single-controller mode: built by the plugin)
    sglang_attention_backend: str = "tik"
    sglang_device: str = "auto"  # auto | cuda | cpu
    sglang_extra_args: list = field(default_factory=list)  # appended verbatim
    local_host: bool = False  # servers/workers on 127.0.0.1 (AReaL's gethostip probes outward)
    seed_per_sample: bool = True  # a distinct SGLang sampling_seed per request
    # model family, when it cannot be read from actor.path/config.json
    model_type: str = ""
    # JSONL stats log; default <AReaL log dir>/tik_stats.jsonl
    stats_jsonl: str = ""
    # testing: perturb one rollout log-prob by one ulp at this train step (-1 = never)
    plant_drift_step: int = -1
    # kernel implementation: a name under kernels/ or a folder (e.g. a `tik search export`); "" = default
    implementation: str = ""
    # set by apply() from actor.backend: which engine's hooks the workers install (fsdp | megatron)
    actor_engine: str = "fsdp"
    # refuse (plan and every worker's first kernel load) when no GPU evidence covers the running
    # kernels x Triton x torch x GPU (`tik qualify` produces it); false: the plan notes it, workers warn
    require_evidence: bool = False

    def __post_init__(self):
        self._check_types()
        if self.prox_mode not in PROX_MODES:
            raise TikConfigError(f"tik.prox_mode: expected one of {PROX_MODES}, got {self.prox_mode!r}")
        if self.on_mismatch not in ON_MISMATCH:
            raise TikConfigError(f"tik.on_mismatch: expected one of {ON_MISMATCH}, got {self.on_mismatch!r}")
        if int(self.monitor_every) < 0 or int(self.monitor_samples) < 1:
            raise TikConfigError(
                f"tik.monitor_every >= 0 and tik.monitor_samples >= 1 expected, got "
                f"{self.monitor_every} / {self.monitor_samples}")
        if self.actor_engine not in ("fsdp", "megatron"):
            raise TikConfigError(f"tik.actor_engine: expected fsdp|megatron, got {self.actor_engine!r}")
        if self.sglang_device not in ("auto", "cuda", "cpu"):
            raise TikConfigError(f"tik.sglang_device: expected auto|cuda|cpu, got {self.sglang_device!r}")
        if isinstance(self.verified_rollout_tp, int):
            self.verified_rollout_tp = [self.verified_rollout_tp]
        if any(x < 1 for x in self.verified_rollout_tp):
            raise TikConfigError(f"tik.verified_rollout_tp: expected tensor-parallel sizes >= 1, got {self.verified_rollout_tp}")
        if isinstance(self.sglang_extra_args, str):
            self.sglang_extra_args = self.sglang_extra_args.split()
        if self.implementation:
            from areal_tik_plugin.runtime import loader

            try:  # resolves, checks the manifest hash and (search exports) the evidence for this device
                self.implementation = loader.load_implementation(loader.resolve_path(str(self.implementation))).path
            except loader.ImplementationError as e:
                raise TikConfigError(f"tik.implementation: {e}") from None

    def select_implementation(self) -> None:
        """Make ``tik.implementation`` the kernels of this process and of the processes it starts."""
        if self.implementation:
            from areal_tik_plugin.runtime import loader

            os.environ["TIK_IMPLEMENTATION"] = self.implementation
            loader.set_implementation(self.implementation)

    def _check_types(self) -> None:
        """Each option has the type of its default (YAML ``true``/``1``/``x`` are told apart), so a typo
        such as ``tik.enable=3`` or ``tik.monitor_every=1.5`` is refused instead of read loosely."""
        for f in dataclasses.fields(self):
            v, name = getattr(self, f.name), f"tik.{f.name}"
            if f.name == "verified_rollout_tp":
                ok = _is_int(v) or (isinstance(v, (list, tuple)) and all(_is_int(x) for x in v))
                want = "an int or a list of ints"
            elif f.name == "sglang_extra_args":
                ok = isinstance(v, str) or (isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v))
                want = "a string or a list of strings"
            elif isinstance(f.default, bool):
                ok, want = isinstance(v, bool), "true or false"
            elif isinstance(f.default, int):
                ok, want = _is_int(v), "an int"
            else:
                ok, want = isinstance(v, str), "a string"
            if not ok:
                raise TikConfigError(f"{name}: expected {want}, got {v!r} ({type(v).__name__})")

    # -- (de)serialisation: an env var every AReaL worker inherits -----------------------------
    def to_env(self) -> str:
        raw = json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode()
        # urlsafe, no padding: AReaL splits scheduling env vars on ',' and '='
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def from_env(cls, value: str | None = None) -> "TikConfig | None":
        value = os.environ.get(ENV_VAR) if value is None else value
        if not value:
            return None
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        return cls(**json.loads(raw))

    @classmethod
    def from_overrides(cls, overrides: list[str], base: dict | None = None) -> "TikConfig":
        """``["tik.enable=true", "+tik.monitor_every=1", ...]`` over ``base`` (a YAML ``tik:``
        section) -> TikConfig; unknown keys raise."""
        return cls(**{**(base or {}), **parse_overrides(overrides)})


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    import yaml

    names = {f.name for f in dataclasses.fields(TikConfig)}
    kw: dict[str, Any] = {}
    for ov in overrides:
        key, sep, val = ov.lstrip("+").partition("=")
        if not sep or not key.startswith("tik."):
            raise TikConfigError(f"expected a tik.<name>=<value> override, got {ov!r}")
        name = key[4:].replace(".", "_")
        if name not in names:
            raise TikConfigError(f"unknown tik option {key!r}; known: {sorted(names)}")
        kw[name] = yaml.safe_load(val) if val != "" else ""
    return kw


def check_section(section: dict) -> dict:
    """Validate a YAML ``tik:`` section (flattened ``a.b`` -> ``a_b``)."""
    names = {f.name for f in dataclasses.fields(TikConfig)}
    out = {}
    for k, v in (section or {}).items():
        if isinstance(v, dict) and k not in ("sglang_extra_args",):
            for k2, v2 in v.items():
                out[f"{k}_{k2}"] = v2
        else:
            out[k] = v
    bad = sorted(set(out) - names)
    if bad:
        raise TikConfigError(f"unknown tik option(s) {bad} in the config's tik section; known: {sorted(names)}")
    return out


# top-level config sections only the plugin reads; removed before AReaL validates the config
PLUGIN_SECTIONS = ("tik", "recipe")


def strip_plugin_sections(cfg) -> dict:
    """Resolve interpolations, then remove the plugin's sections from an OmegaConf config."""
    from omegaconf import OmegaConf, open_dict

    found = {}
    if not any(k in cfg for k in PLUGIN_SECTIONS):
        return found
    OmegaConf.resolve(cfg)
    with open_dict(cfg):
        for k in PLUGIN_SECTIONS:
            if k in cfg:
                node = cfg[k]
                found[k] = OmegaConf.to_container(node, resolve=True) if node is not None else {}
                del cfg[k]
    return found


def split_tik_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` into (tik overrides, everything else)."""
    tik, rest = [], []
    for a in argv:
        (tik if re.match(r"^\+?tik\.", a) else rest).append(a)
    return tik, rest


# -- reading AReaL configs ---------------------------------------------------------------------
def parse_backend(spec: str) -> tuple[str, dict[str, int]]:
    """``"sglang:d4p1t2"`` -> ("sglang", {"d": 4, "p": 1, "t": 2}); bare dims -> backend ""."""
    spec = (spec or "").strip()
    # the name ends at the first ':' (a hybrid "megatron:(attn:...|ffn:...)" has more)
    name, _, dims = spec.partition(":") if ":" in spec else ("", "", spec)
    out = {k: int(v) for k, v in re.findall(r"([a-z])(\d+)", dims)}
    return name, out


def staleness_of(cfg) -> int:
    return int(getattr(cfg.rollout, "max_head_offpolicyness", 0) or 0)


def detect_model_type(cfg, tik: TikConfig) -> str | None:
    if tik.model_type:
        return tik.model_type
    path = getattr(cfg.actor, "path", "") or ""
    p = os.path.join(path, "config.json")
    if os.path.isfile(p):
        with open(p) as f:
            return json.load(f).get("model_type")
    try:  # a hub id: transformers' cache (or the hub, where reachable)
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path, trust_remote_code=True).model_type
    except Exception:  # noqa: BLE001 -- reported below as "cannot tell"
        return None


def supported_families() -> tuple[str, ...]:
    try:
        from areal_tik_plugin.integrations import transformers as T

        return tuple(T.FAMILIES)
    except Exception:  # noqa: BLE001 -- transformers missing: the table above
        return DEFAULT_FAMILIES


@dataclass
class Plan:
    """What the plugin does to one AReaL config (logged at start, stored with the run)."""

    enabled: bool
    mode: str  # reuse | recompute-prox | loglinear | baseline
    staleness: int
    recompute_forward: bool
    changes: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def describe(self) -> str:
        lines = [f"[tik] plugin {'ON' if self.enabled else 'OFF (baseline)'}; staleness {self.staleness}; "
                 f"mode {self.mode}; recompute forward {'RUNS' if self.recompute_forward else 'skipped'}"]
        lines += [f"[tik]   {k}: {a!r} -> {b!r}" for k, (a, b) in self.changes.items()]
        lines += [f"[tik]   {n}" for n in self.notes]
        return "\n".join(lines)


def check(cfg, tik: TikConfig, model_type: str | None = None) -> None:
    """Raise :class:`TikConfigError` where rollout log-probs cannot be reused bitwise."""
    errs = []
    g, a = cfg.gconfig, cfg.actor
    rname, rdims = parse_backend(getattr(cfg.rollout, "backend", "") or "")
    aname, _ = parse_backend(getattr(a, "backend", "") or "")
    if rname and rname != "sglang":
        errs.append(f"rollout.backend {cfg.rollout.backend!r}: the plugin's rollout side is SGLang only")
    if aname and aname not in ("fsdp", "megatron"):
        errs.append(f"actor.backend {a.backend!r}: the plugin patches the FSDP and Megatron engines only")
    # -- Megatron actor: the settings its spec keeps bit-identical (integrations/megatron/areal.py)
    if aname == "megatron":
        from areal_tik_plugin.integrations.megatron.areal import check_actor

        errs.extend(check_actor(cfg))
    # -- end Megatron
    t_roll = 1.0 if getattr(g, "greedy", False) else float(g.temperature)
    if t_roll != float(a.temperature):
        errs.append(f"temperature differs between rollout and training: gconfig "
                    f"{'greedy (log-probs at T=1)' if getattr(g, 'greedy', False) else f'temperature={g.temperature}'}"
                    f" vs actor.temperature={a.temperature}; the log-probs would come from different "
                    f"distributions (set actor.temperature=${{gconfig.temperature}})")
    top_p, top_k = float(getattr(g, "top_p", 1.0)), int(getattr(g, "top_k", _TOPK_OFF))
    if top_p < 1.0 or 0 < top_k < _TOPK_OFF:
        errs.append(f"gconfig.top_p={top_p} / top_k={top_k}: samples come from the top-k/top-p "
                    f"renormalized distribution, which the returned (and the training) log-probs "
                    f"do not describe; use top_p=1.0 and top_k=-1 (or {_TOPK_OFF})")
    if float(getattr(g, "min_p", 0.0) or 0.0) > 0.0:
        errs.append(f"gconfig.min_p={g.min_p}: renormalized sampling distribution (use min_p=0)")
    if float(getattr(g, "frequency_penalty", 0.0) or 0.0) != 0.0:
        errs.append(f"gconfig.frequency_penalty={g.frequency_penalty}: penalized logits are not the "
                    f"policy's; use 0")
    sg = getattr(cfg, "sglang", None)
    kv = str(getattr(sg, "kv_cache_dtype", "auto") or "auto") if sg is not None else "auto"
    if kv not in ("auto", "bfloat16", "bf16", "float16", "fp16"):
        errs.append(f"sglang.kv_cache_dtype={kv!r}: a quantized KV cache changes the rollout logits; "
                    f"use 'auto'")
    if sg is not None and str(getattr(sg, "dtype", a.dtype)) != str(a.dtype):
        errs.append(f"sglang.dtype={sg.dtype!r} differs from actor.dtype={a.dtype!r}: both sides must "
                    f"compute in one dtype")
    tp = rdims.get("t", 1)
    if tp not in tik.verified_rollout_tp:
        errs.append(f"rollout TP {tp} ({cfg.rollout.backend}) was not verified bitwise against the "
                    f"training forward (verified: {tik.verified_rollout_tp}); run the SGLang TP check "
                    f"and add it with tik.verified_rollout_tp=[...]")
    fams = supported_families()
    if model_type is None:
        errs.append(f"cannot tell the model family of actor.path={a.path!r} (no config.json); set "
                    f"tik.model_type=<one of {list(fams)}>")
    elif model_type not in fams:
        errs.append(f"model family {model_type!r} is not patched by the plugin (supported: {list(fams)})")
    ev = evidence_status()
    if tik.require_evidence and ev["covered"] is False:
        errs.append(f"tik.require_evidence=true: {ev['message']}")
    s = staleness_of(cfg)
    if s > 0 and tik.prox_mode == "loglinear" and getattr(a, "rejection_sampling", None) is None:
        errs.append("staleness > 0 with tik.prox_mode=loglinear needs actor.rejection_sampling (e.g. "
                    "{metric: ratio, upper: 5.0}): without it AReaL drops the behaviour importance weight")
    if errs:
        raise TikConfigError("areal-tik-plugin refuses this configuration:\n  - " + "\n  - ".join(errs))


def plan(cfg, tik: TikConfig, model_type: str | None = "__detect__") -> Plan:
    """Check ``cfg`` and compute the changes (does not modify ``cfg``)."""
    s = staleness_of(cfg)
    a = cfg.actor
    recompute_now = _forward_runs(a.use_decoupled_loss, a.recompute_logprob, getattr(a, "prox_logp_method", "recompute"))
    if not tik.enable:
        return Plan(False, "baseline", s, recompute_now, notes=["stock AReaL: stats/throughput logging only"])
    if model_type == "__detect__":
        model_type = detect_model_type(cfg, tik)
    check(cfg, tik, model_type)
    changes: dict[str, tuple] = {}
    notes = [f"model family {model_type}", evidence_status()["message"]]

    def setv(name, value):
        old = getattr(a, name)
        if old != value:
            changes[f"actor.{name}"] = (old, value)

    if s == 0:
        setv("recompute_logprob", False)
        setv("use_decoupled_loss", False)
        mode = "reuse"
        notes.append("staleness 0: rollout log-probs serve as old and proximal log-probs")
    elif tik.prox_mode == "loglinear":
        setv("recompute_logprob", False)
        setv("use_decoupled_loss", True)
        setv("prox_logp_method", "loglinear")
        mode = "loglinear"
        notes.append(f"staleness {s}: proximal policy by AReaL's log-linear approximation (no forward); "
                     f"behaviour importance weight applied via rejection_sampling={a.rejection_sampling}")
    elif a.use_decoupled_loss or a.recompute_logprob:
        setv("prox_logp_method", "recompute")
        mode = "recompute-prox"
        notes.append(f"staleness {s}: the forward pass still runs for the proximal policy only "
                     f"(tik.prox_mode=recompute); behaviour log-probs are the exact rollout values")
    else:
        mode = "reuse"
        notes.append(f"staleness {s} without decoupled loss: old log-probs are the rollout's, as configured")
    after = {k.split(".", 1)[1]: v[1] for k, v in changes.items()}
    fwd = _forward_runs(after.get("use_decoupled_loss", a.use_decoupled_loss),
                        after.get("recompute_logprob", a.recompute_logprob),
                        after.get("prox_logp_method", getattr(a, "prox_logp_method", "recompute")))
    return Plan(True, mode, s, fwd, changes, notes)


def evidence_status() -> dict:
    """GPU evidence for the selected kernels x this process's Triton x torch x GPU
    (:func:`areal_tik_plugin.runtime.loader.evidence_status`); ``covered`` is None where this process has no GPU
    (the controller of a multi-node job): the workers check at their first kernel load."""
    from areal_tik_plugin.runtime import loader

    st = dict(loader.evidence_status())
    if st["covered"] is None:
        st["message"] = ("evidence: this process has no GPU; each worker checks the evidence for its "
                         "kernels x Triton x torch x GPU at its first kernel load")
    return st


def _forward_runs(decoupled: bool, recompute: bool, method: str) -> bool:
    # AReaL's PPOActorConfig.should_compute_prox_logp()
    return bool((decoupled and method not in ("loglinear",)) or (not decoupled and recompute))


def apply(cfg, p: Plan, tik: TikConfig) -> None:
    """Apply a plan to ``cfg`` in place and route AReaL's workers through the plugin's worker."""
    for key, (_, new) in p.changes.items():
        section, name = key.split(".", 1)
        setattr(getattr(cfg, section), name, new)
    # -- the workers install the engine-specific hooks of actor.backend (fsdp or megatron)
    tik.actor_engine = parse_backend(getattr(cfg.actor, "backend", "") or "")[0] or "fsdp"
    env = tik.to_env()
    for spec in iter_scheduling_specs(cfg):
        spec.env_vars = dict(spec.env_vars or {})
        spec.env_vars[ENV_VAR] = env
        if tik.require_evidence:
            spec.env_vars["TIK_REQUIRE_EVIDENCE"] = "1"
        # also for baseline runs: the SGLang command for the installed SGLang + the observing monitor
        spec.cmd = worker_cmd(spec.cmd)


def iter_scheduling_specs(cfg):
    seen = set()
    for section in ("actor", "ref", "critic", "rollout", "teacher"):
        sec = getattr(cfg, section, None)
        for spec in getattr(sec, "scheduling_spec", None) or ():
            if id(spec) not in seen:
                seen.add(id(spec))
                yield spec


def worker_cmd(cmd: str | None) -> str | None:
    """AReaL's default worker command -> the plugin's worker (same CLI); custom commands refused."""
    if not cmd or WORKER_MODULE in cmd:
        return cmd
    parts = cmd.split()
    if len(parts) == 3 and parts[0].startswith("python") and parts[1] == "-m" and parts[2] == "areal.infra.rpc.rpc_server":
        return f"{parts[0]} -m {WORKER_MODULE}"
    raise TikConfigError(
        f"scheduling_spec.cmd={cmd!r} is not AReaL's default worker; run "
        f"'python3 -m {WORKER_MODULE}' (it installs the plugin, then runs areal.infra.rpc.rpc_server) "
        f"or call areal_tik_plugin.integrations.areal.hooks.install_worker() in your worker")

"""``tik compare``: tik vs baseline AReaL runs -> markdown report + PNG plots (the paper's layout).

Sources (any mix):

* local: a ``tik_stats.jsonl`` written by the plugin (``areal_tik_plugin.run``), or a folder searched
  for them, or an offline W&B run folder (``offline-run-*``; read with wandb's own datastore reader);
* ``wandb:ENTITY/PROJECT[?group=G&tag=T]``: runs from the W&B online API (``import wandb`` inside).

Runs are grouped into *configs* (the recipe cell: algorithm, model, staleness; W&B group) and
*modes* (tik / baseline / ...). Seeds of one (config, mode) are averaged. Report sections:
throughput per config with the ratio tik/baseline, per-phase times, reward curves (raw + moving
average) with the mean-reward ratio, policy loss, gradient norm, and the mismatch metrics.
"""

from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import dataclass, field

REWARD_KEYS = ("ppo_actor/task_reward/avg", "rollout/reward")
LOSS_KEY = "ppo_actor/update/actor_loss/avg"
GRAD_KEY = "ppo_actor/update/grad_norm"
TOKENS_KEY = "tik/throughput/response_tokens"
WALL_KEY = "tik/throughput/step_wall_s"
MISMATCH_KEYS = ("tik/mismatch/frac_mismatch", "tik/mismatch/max_abs_diff")
IW_KEYS = ("ppo_actor/update/importance_weight/min", "ppo_actor/update/importance_weight/max")


@dataclass
class Run:
    name: str
    config: str
    mode: str
    seed: str
    rows: list = field(default_factory=list)  # [{"step": int, key: float}]
    source: str = ""

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(r["step"], r[key]) for r in self.rows if key in r and _finite(r[key])]

    def reward_key(self) -> str | None:
        return next((k for k in REWARD_KEYS if self.series(k)), None)


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


# -- loading -------------------------------------------------------------------------------------
def _labels(meta: dict) -> tuple[str, str, str]:
    rec = meta.get("recipe") or {}
    w = meta.get("wandb") or {}
    plan = meta.get("plan") or {}
    tik = meta.get("tik") or {}
    mode = rec.get("mode") or (w.get("name") or "").split("-seed")[0] or \
        ("tik" if (tik.get("enable") if tik else plan.get("enabled")) else "baseline")
    config = w.get("group") or meta.get("experiment_name") or "run"
    seed = (meta.get("trial_name") or "").rsplit("seed", 1)[-1] or "0"
    return config, mode, seed


def load_jsonl(path: str) -> Run:
    meta, rows = {}, []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            d = json.loads(line)
            if "meta" in d:
                meta = d["meta"]
            else:
                rows.append(d)
    config, mode, seed = _labels(meta)
    name = f"{meta.get('experiment_name', '?')}/{meta.get('trial_name', '?')}"
    return Run(name, config, mode, seed, sorted(rows, key=lambda r: r["step"]), path)


def load_wandb_offline(run_dir: str) -> Run | None:
    """An offline W&B run folder (``offline-run-*/run-*.wandb``) via wandb's datastore reader."""
    files = glob.glob(os.path.join(run_dir, "*.wandb"))
    if not files:
        return None
    from wandb.proto import wandb_internal_pb2 as pb
    from wandb.sdk.internal import datastore

    ds = datastore.DataStore()
    ds.open_for_scan(files[0])
    rows, cfg = [], {}
    while True:
        data = ds.scan_data()
        if data is None:
            break
        rec = pb.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            row = {}
            for it in rec.history.item:
                key = it.key or "/".join(it.nested_key)
                try:
                    row[key] = json.loads(it.value_json)
                except ValueError:
                    continue
            if "_step" in row:
                row["step"] = int(row["_step"])
                rows.append(row)
        elif kind == "run":
            r = rec.run
            cfg = {"wandb": {"group": r.run_group, "name": r.display_name, "tags": list(r.tags)},
                   "experiment_name": r.project, "trial_name": r.display_name}
    config, mode, seed = _labels(cfg)
    return Run(cfg.get("trial_name") or run_dir, config, mode, seed, rows, run_dir)


def load_wandb_online(spec: str) -> list[Run]:
    """``wandb:ENTITY/PROJECT[?group=G&tag=T]`` through the W&B public API."""
    import urllib.parse

    import wandb

    path, _, query = spec[len("wandb:"):].partition("?")
    q = dict(urllib.parse.parse_qsl(query))
    filters = {}
    if "group" in q:
        filters["group"] = q["group"]
    if "tag" in q:
        filters["tags"] = {"$in": [q["tag"]]}
    runs = []
    for r in wandb.Api().runs(path, filters=filters or None):
        rows = []
        for h in r.scan_history():
            row = {k: v for k, v in h.items() if _finite(v)}
            row["step"] = int(h.get("_step", len(rows)))
            rows.append(row)
        mode = (r.job_type or (r.name or "").split("-seed")[0] or "run")
        seed = (r.name or "").rsplit("seed", 1)[-1] or "0"
        runs.append(Run(r.name, r.group or r.project, mode, seed, rows, r.url))
    return runs


def load(sources: list[str]) -> list[Run]:
    runs: list[Run] = []
    for src in sources:
        if src.startswith("wandb:"):
            runs += load_wandb_online(src)
        elif os.path.isfile(src):
            runs.append(load_jsonl(src))
        elif os.path.isdir(src):
            found = sorted(glob.glob(os.path.join(src, "**", "tik_stats.jsonl"), recursive=True))
            runs += [load_jsonl(p) for p in found]
            if not found:  # offline W&B runs
                for d in sorted(glob.glob(os.path.join(src, "**", "offline-run-*"), recursive=True)):
                    r = load_wandb_offline(d)
                    if r is not None:
                        runs.append(r)
        else:
            raise FileNotFoundError(f"no such run source: {src}")
    return [r for r in runs if r.rows]


# -- statistics ----------------------------------------------------------------------------------
def moving_average(xs: list[float], window: int) -> list[float]:
    out, acc = [], []
    for x in xs:
        acc.append(x)
        if len(acc) > window:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def throughput(run: Run) -> float:
    """Completed response tokens / wall time over the whole run."""
    toks = sum(v for _, v in run.series(TOKENS_KEY))
    wall = sum(v for _, v in run.series(WALL_KEY))
    return toks / wall if wall > 0 else float("nan")


def mean_of(run: Run, key: str) -> float:
    s = [v for _, v in run.series(key)]
    return sum(s) / len(s) if s else float("nan")


def _avg(xs):
    xs = [x for x in xs if _finite(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def _ratio(a, b):
    return a / b if _finite(a) and _finite(b) and b != 0 else float("nan")


def _fmt(x, spec=".3g"):
    return format(x, spec) if _finite(x) else "n/a"


def group_runs(runs: list[Run]) -> dict[str, dict[str, list[Run]]]:
    out: dict[str, dict[str, list[Run]]] = {}
    for r in runs:
        out.setdefault(r.config, {}).setdefault(r.mode, []).append(r)
    return out


def mean_curve(runs: list[Run], key: str) -> tuple[list[int], list[float]]:
    by: dict[int, list[float]] = {}
    for r in runs:
        for s, v in r.series(key):
            by.setdefault(s, []).append(v)
    steps = sorted(by)
    return steps, [sum(by[s]) / len(by[s]) for s in steps]


# -- report --------------------------------------------------------------------------------------
def report(runs: list[Run], out_dir: str, window: int = 10, tik_mode: str = "tik",
           base_mode: str = "baseline") -> str:
    os.makedirs(out_dir, exist_ok=True)
    groups = group_runs(runs)
    modes = sorted({r.mode for r in runs}, key=lambda m: (m != base_mode, m))
    L = ["# tik compare", "", f"{len(runs)} runs, {len(groups)} configs, modes: {', '.join(modes)}.", ""]
    # throughput
    L += ["## Throughput (completed response tokens / wall time)", "",
          "| config | " + " | ".join(f"{m} tok/s" for m in modes) + f" | {tik_mode}/{base_mode} |",
          "|---|" + "---|" * (len(modes) + 1)]
    tput = {}
    for cfg, by in sorted(groups.items()):
        vals = {m: _avg([throughput(r) for r in by.get(m, [])]) for m in modes}
        tput[cfg] = vals
        L.append(f"| {cfg} | " + " | ".join(_fmt(vals[m]) for m in modes)
                 + f" | {_fmt(_ratio(vals.get(tik_mode), vals.get(base_mode)), '.3f')} |")
    # phases
    phase_keys = sorted({k for r in runs for row in r.rows for k in row if k.startswith("timeperf/")
                         and not k.endswith("__count")})
    phase_means = {(cfg, m): {k: _avg([mean_of(r, k) for r in by[m]]) for k in phase_keys}
                   for cfg, by in groups.items() for m in modes if m in by}
    if phase_keys:
        L += ["", "## Per-phase time (s per step, mean over steps and seeds)", "",
              "| config | mode | " + " | ".join(k.split("/", 1)[1] for k in phase_keys) + " |",
              "|---|---|" + "---|" * len(phase_keys)]
        for cfg, by in sorted(groups.items()):
            for m in modes:
                if m in by:
                    L.append(f"| {cfg} | {m} | " + " | ".join(_fmt(_avg([mean_of(r, k) for r in by[m]]))
                                                              for k in phase_keys) + " |")
    # rewards, loss, grad norm, mismatch
    L += ["", "## Reward", "", "| config | " + " | ".join(f"{m} mean reward" for m in modes)
          + f" | {tik_mode}/{base_mode} |", "|---|" + "---|" * (len(modes) + 1)]
    for cfg, by in sorted(groups.items()):
        vals = {}
        for m in modes:
            rs = by.get(m, [])
            vals[m] = _avg([mean_of(r, r.reward_key()) for r in rs if r.reward_key()])
        L.append(f"| {cfg} | " + " | ".join(_fmt(vals[m], ".4g") for m in modes)
                 + f" | {_fmt(_ratio(vals.get(tik_mode), vals.get(base_mode)), '.3f')} |")
    L += ["", "## Policy loss, gradient norm, importance weight, mismatch (means over steps)", "",
          "| config | mode | policy loss | grad norm | IW min | IW max | mismatch frac | max abs dlogp |",
          "|---|---|---|---|---|---|---|---|"]
    for cfg, by in sorted(groups.items()):
        for m in modes:
            if m not in by:
                continue
            rs = by[m]
            iwmin = min((v for r in rs for _, v in r.series(IW_KEYS[0])), default=float("nan"))
            iwmax = max((v for r in rs for _, v in r.series(IW_KEYS[1])), default=float("nan"))
            L.append(f"| {cfg} | {m} | {_fmt(_avg([mean_of(r, LOSS_KEY) for r in rs]))} | "
                     f"{_fmt(_avg([mean_of(r, GRAD_KEY) for r in rs]))} | {_fmt(iwmin, '.9g')} | {_fmt(iwmax, '.9g')} | "
                     f"{_fmt(_avg([mean_of(r, MISMATCH_KEYS[0]) for r in rs]))} | "
                     f"{_fmt(max((v for r in rs for _, v in r.series(MISMATCH_KEYS[1])), default=float('nan')))} |")
    L += ["", "## Runs", "", "| config | mode | seed | run | steps | source |", "|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r.config, r.mode, r.seed)):
        L.append(f"| {r.config} | {r.mode} | {r.seed} | {r.name} | {len(r.rows)} | {r.source} |")
    plots = _plots(groups, modes, tput, out_dir, window, tik_mode, base_mode, phase_means)
    if plots:
        L += ["", "## Plots", ""] + [f"![{os.path.splitext(p)[0]}]({p})" for p in plots]
    text = "\n".join(L) + "\n"
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(text)
    return text


def _phase_bars(plt, phase_means: dict, out_dir: str) -> list[str]:
    """Stacked bars of the mean per-phase time per step, one bar per (config, mode)."""
    if not phase_means:
        return []
    bars = sorted(phase_means)
    keys = sorted({k for v in phase_means.values() for k in v})
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(bars) + 3), 3.8))
    bottom = [0.0] * len(bars)
    for k in keys:
        vals = [phase_means[b].get(k) for b in bars]
        vals = [v if _finite(v) else 0.0 for v in vals]
        ax.bar(range(len(bars)), vals, 0.6, bottom=bottom, label=k.split("/", 1)[1])
        bottom = [a + b for a, b in zip(bottom, vals)]
    ax.set_xticks(range(len(bars)), [f"{c}\n{m}" for c, m in bars], rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("s per step (mean)")
    ax.set_title("Per-phase time")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "phases.png"), dpi=110)
    plt.close(fig)
    return ["phases.png"]


def _plots(groups, modes, tput, out_dir, window, tik_mode, base_mode, phase_means=None) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    files = []
    cfgs = sorted(groups)
    # throughput bars per config, ratio annotated
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(cfgs) + 2), 3.6))
    w = 0.8 / max(len(modes), 1)
    for i, m in enumerate(modes):
        ax.bar([j + i * w for j in range(len(cfgs))], [tput[c].get(m, float("nan")) for c in cfgs], w, label=m)
    for j, c in enumerate(cfgs):
        r = _ratio(tput[c].get(tik_mode), tput[c].get(base_mode))
        if _finite(r):
            ax.text(j + w * (len(modes) - 1) / 2, max(v for v in tput[c].values() if _finite(v)), f"x{r:.2f}",
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks([j + w * (len(modes) - 1) / 2 for j in range(len(cfgs))], cfgs, rotation=20, ha="right", fontsize=7)
    ax.set_ylabel("response tokens / s")
    ax.set_title("Throughput per config")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "throughput.png"), dpi=110)
    plt.close(fig)
    files.append("throughput.png")
    files += _phase_bars(plt, phase_means or {}, out_dir)
    panels = [("reward", None), ("policy_loss", LOSS_KEY), ("grad_norm", GRAD_KEY),
              ("mismatch_frac", MISMATCH_KEYS[0])]
    for fname, key in panels:
        fig, axes = plt.subplots(1, len(cfgs), figsize=(4.2 * len(cfgs), 3.2), squeeze=False)
        drawn = False
        for ax, c in zip(axes[0], cfgs):
            for m in modes:
                rs = groups[c].get(m, [])
                k = key or next((r.reward_key() for r in rs if r.reward_key()), None)
                if not rs or k is None:
                    continue
                steps, ys = mean_curve(rs, k)
                if not steps:
                    continue
                drawn = True
                line, = ax.plot(steps, ys, alpha=0.35 if key is None else 1.0, label=f"{m}" + (" raw" if key is None else ""))
                if key is None:
                    ax.plot(steps, moving_average(ys, window), color=line.get_color(), label=f"{m} MA{window}")
            ax.set_title(c, fontsize=8)
            ax.set_xlabel("step")
            ax.legend(fontsize=7)
        axes[0][0].set_ylabel(fname.replace("_", " "))
        fig.tight_layout()
        if drawn:
            fig.savefig(os.path.join(out_dir, f"{fname}.png"), dpi=110)
            files.append(f"{fname}.png")
        plt.close(fig)
    return files


def register(sub) -> None:
    p = sub.add_parser("compare", help="tik vs baseline AReaL runs -> markdown report + PNG plots")
    p.add_argument("sources", nargs="+", help="tik_stats.jsonl files, folders, offline W&B run folders, "
                                              "or wandb:ENTITY/PROJECT[?group=G&tag=T]")
    p.add_argument("-o", "--out", default="tik-compare", help="output folder (report.md + *.png)")
    p.add_argument("--window", type=int, default=10, help="moving-average window for reward curves")
    p.add_argument("--tik-mode", default="tik")
    p.add_argument("--baseline-mode", default="baseline")
    p.set_defaults(func=_cmd)


def _cmd(args) -> int:
    runs = load(args.sources)
    if not runs:
        print("no runs with stats found", flush=True)
        return 1
    text = report(runs, args.out, args.window, args.tik_mode, args.baseline_mode)
    print(text)
    print(f"written: {os.path.join(args.out, 'report.md')}")
    return 0

r"""``bandcore train --compare``: clip, clip-higher and band-kl with identical seeds and budgets.

For each seed the first method runs the warm-up; every other method starts from its ``warmup.pt`` (same
policy, same random streams), so the methods differ only in their ratio bounds:

- ``clip``: :math:`[1-\varepsilon, 1+\varepsilon]`, :math:`\varepsilon = 0.2`;
- ``clip-higher``: :math:`[0.8, 1.28]`;
- ``band-kl``: the Band of :math:`KL(\pi_{old}\|\pi) \le \delta`, :math:`\delta = 0.05`.

Writes ``DIR/runs/<method>/seed<k>/metrics.jsonl``, ``DIR/summary.json`` (per method the final evaluation and
the curve metrics -- area under the reward curve, reward and entropy over the first / middle / last third of
the steps -- as mean, standard deviation, standard error, 95 % Student-t interval and per-seed values; per-seed
differences from ``clip`` with the paired t interval, seeds ahead, t and p (:mod:`.stats`); the regime: how rare
the rewarded answer starts, how far the ratio moves; the command, torch threads and deterministic mode),
``DIR/summary.md`` (the table of the README and docs/results.md, :func:`render_markdown`) and ``DIR/reward.png``,
``DIR/entropy.png``, ``DIR/clipfrac.png`` (mean and its 95 % interval over seeds against the RL step).
Runs are deterministic on one machine: fixed seeds, a fixed torch thread count and
``torch.use_deterministic_algorithms`` (:func:`.train.run`).  ``--resume`` skips finished runs, continues
interrupted ones and starts the missing ones (and rewrites the summary); an output directory that already holds
a comparison is refused unless ``--resume`` or ``--new-run`` (which replaces it) is given, and that is checked
for every run before the first one starts.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from .buckets import MECHANISM_FIELDS, mechanism
from .config import TrainConfig
from .stats import CI_LEVEL, format_diff, format_mean, mean_ci, paired_difference, t_quantile
from .train import CHECKPOINT_FILE, METRICS_FILE, RUN_FILES, WARMUP_FILE, read_metrics, run, run_finished

__all__ = ["BUDGETS", "METHOD_PRESETS", "compare", "plot_curves", "render_markdown", "summarise"]

#: The three methods of the toy reproduction: name -> loss settings (TrainConfig fields).
METHOD_PRESETS: dict[str, dict[str, Any]] = {
    "clip": {"method": "clip", "clip_eps": 0.2},
    "clip-higher": {"method": "clip-higher", "clip_eps": 0.2, "clip_eps_high": 0.28},
    "band-kl": {"method": "band", "divergence": "kl", "delta": 0.05},
}
#: Files of a comparison's output directory (besides runs/).
SUMMARY_FILES = ("summary.json", "summary.md", "reward.png", "entropy.png", "clipfrac.png")

#: The regime of ``--compare`` (README, "Train: the toy reproduction"): the reversal starts rare (3 % of the
#: habit-phase demonstrations, π(answer) ≈ 0.01 after the warm-up) and 8 passes × 2 minibatches = 16 Adam
#: steps per batch move the ratio (mean |log r| 0.3-0.4 per batch, 6-9 % of tokens clipped).
REGIME: dict[str, Any] = {"demo_correct": 0.03, "ppo_epochs": 8}
#: The budgets of ``--compare`` (``--quick`` and the default); command-line options override them.
BUDGETS: dict[str, dict[str, Any]] = {
    "quick": {**REGIME, "steps": 40},
    "full": {**REGIME, "steps": 80},
}
#: Seeds of each budget when ``seeds`` is not given.
SEEDS = {"quick": 10, "full": 10}

#: Final-evaluation fields reported in summary.json (name in the summary -> metrics field).
SUMMARY_FIELDS = {
    "reward": "eval_reward",
    "entropy": "eval_entropy",
    "pass_at_k": "eval_pass_at_k",
    "accuracy": "eval_accuracy",
}
#: Start-of-run fields (the regime) besides SUMMARY_FIELDS: name in the summary -> metrics field.
START_FIELDS = {
    "fork_frac": "eval_fork_frac",
    "answer_prob": "eval_answer_prob",
    "first_token_prob": "eval_first_token_prob",
}
#: Windows of the training curves: the first, middle and last third of the RL steps.
WINDOWS = ("early", "mid", "late")
#: Metrics compared seed by seed against the reference method (clip).
PAIRED_FIELDS = ("reward_auc", "reward_early", "reward", "pass_at_k", "entropy", "entropy_late")
#: Curves: file stem -> (metrics field, y label).
CURVES = {
    "reward": ("reward", "mean reward of the batch"),
    "entropy": ("entropy", "mean token entropy (nat)"),
    "clipfrac": ("clipfrac", "fraction of tokens clipped"),
}
#: Columns of summary.md's third table, the rare-token mechanism (:data:`.buckets.MECHANISM_FIELDS`).
MECHANISM_TABLE = ("clip_low_rare", "clip_high_rare", "clip_low_common", "clip_high_common", "log_ratio_neg_rare")
#: Columns of summary.md: summary key -> header (``{k}``: eval_k).
TABLE_COLUMNS = {"reward": "final reward", "pass_at_k": "pass@{k}", "entropy": "final entropy (nat)",
                 "entropy_late": "entropy, last third", "reward_auc": "reward AUC"}


def compare(out: str | Path, *, overrides: dict[str, Any] | None = None, seeds: int | None = None,
            quick: bool = False, resume: bool = False, new_run: bool = False, progress: bool = True,
            threads: int | None = 1) -> dict[str, Any]:
    """Train every method of :data:`METHOD_PRESETS` for ``seeds`` seeds; write the summary and the plots.

    Parameters
    ----------
    out : output directory.
    overrides : :class:`TrainConfig` fields that replace the budget's (e.g. ``{"steps": 5}``); the loss fields
        (method, divergence, delta, clip_eps, clip_eps_high) are set per method and may not be given.
    seeds : number of seeds (``seed``, ``seed + 1``, ...), at least 1 (2 or more for an interval; 10 or more for
        one worth quoting); default :data:`SEEDS` of the budget.
    quick : use the ``quick`` budget instead of ``full``.
    resume : keep finished runs, continue unfinished ones, start missing ones.
    new_run : replace a comparison already in ``out`` (without it, and without ``resume``, one is refused).
    progress : show a progress bar.
    threads : torch CPU threads of every run (recorded in the summary); ``None`` keeps torch's setting.

    Returns
    -------
    The summary (also written to ``out/summary.json``).
    """
    budget = "quick" if quick else "full"
    command = _command(out, quick, seeds, overrides, threads)
    seeds = SEEDS[budget] if seeds is None else seeds
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds: must be a positive integer, got {seeds!r}")
    overrides = dict(overrides or {})
    per_method = {key for preset in METHOD_PRESETS.values() for key in preset}
    clash = sorted(per_method & overrides.keys())
    if clash:
        raise ValueError(f"compare: {clash} are set per method and cannot be overridden")
    base = TrainConfig(**{**BUDGETS[budget], **overrides})
    out = Path(out)
    first_method = next(iter(METHOD_PRESETS))
    jobs = []
    for k in range(seeds):
        for name in METHOD_PRESETS:
            config = dataclasses.replace(base, seed=base.seed + k, **{"clip_eps_high": None, **METHOD_PRESETS[name]})
            jobs.append((name, config, out / "runs" / name / f"seed{config.seed}"))
    _check_out(out, [directory for _, _, directory in jobs], resume, new_run)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in METHOD_PRESETS}
    bar = _progress(progress, len(jobs))
    for name, config, directory in jobs:
        warm_start = None if name == first_method else out / "runs" / first_method / f"seed{config.seed}" / WARMUP_FILE
        if not (resume and run_finished(directory, config.steps)):
            # resume where a checkpoint exists; otherwise a new run (checked above: absent, or new_run)
            run(config, directory, resume=resume and (directory / CHECKPOINT_FILE).exists(), new_run=new_run,
                warm_start=warm_start, progress=False, threads=threads)
        runs[name].append(read_metrics(directory / METRICS_FILE))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()

    summary = summarise(runs, base, seeds)
    import torch

    summary["command"] = command
    summary["determinism"] = {
        "seeds": [base.seed + k for k in range(seeds)],
        "torch_threads": torch.get_num_threads() if threads is None else threads,
        "deterministic_algorithms": "strict" if base.device == "cpu" else "warn_only",
        "torch_version": torch.__version__,
    }
    summary["wall_time_s"] = time.perf_counter() - started
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(render_markdown(summary))
    plot_curves(runs, out)
    return summary


def _command(out: str | Path, quick: bool, seeds: int | None, overrides: dict[str, Any] | None,
             threads: int | None) -> str:
    """The ``bandcore train --compare`` command line that reproduces this comparison."""
    words = ["bandcore", "train", "--compare", *(["--quick"] if quick else []), "--out", str(out)]
    if seeds is not None:
        words += ["--seeds", str(seeds)]
    if threads != 1:
        words += ["--threads", str(threads)]
    for key, value in (overrides or {}).items():
        words += ["--" + key.replace("_", "-"), "none" if value is None else str(value)]
    return " ".join(words)


def _check_out(out: Path, directories: list[Path], resume: bool, new_run: bool) -> None:
    """Refuse, before any run starts, to overwrite a comparison (or a run without a checkpoint on resume)."""
    if new_run:
        return
    if resume:
        for directory in directories:
            if not (directory / CHECKPOINT_FILE).exists() and any((directory / f).exists() for f in RUN_FILES):
                raise ValueError(f"resume: {str(directory)!r} holds a run without {CHECKPOINT_FILE}; it stays "
                                 "untouched (pass --new-run to replace the comparison)")
        return
    held = [f for f in SUMMARY_FILES if (out / f).exists()]
    held += [str(d.relative_to(out)) for d in directories if any((d / f).exists() for f in RUN_FILES)]
    if held:
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise ValueError(f"out: {str(out)!r} already holds a comparison ({shown}); pass --resume to continue it, "
                         "--new-run to replace it, or choose a new --out")


def summarise(runs: dict[str, list[list[dict[str, Any]]]], base: TrainConfig, seeds: int) -> dict[str, Any]:
    r"""The summary: per method the final evaluation and the curves (:func:`.stats.mean_ci` over seeds).

    Per method: the final ``reward``, ``entropy``, ``pass_at_k`` and ``accuracy`` (of the fixed evaluation set,
    ``eval_k`` samples per prompt); from the training curves ``reward_auc``, the normalised area under the
    batch-reward curve :math:`\frac1S\sum_{s=1}^S R_s` (sample efficiency: 1 = solved from the first step),
    and the mean batch reward and entropy over the first, middle and last third of the steps
    (``reward_early`` ... ``entropy_late``); ``clipfrac`` (mean over the run), ``abs_log_ratio`` (mean over the
    run of the mean |log r| after the last update of a batch: how far the ratio moves per batch) and, for the
    Band, ``band_cost_frac`` (mean over the run); the rare-token numbers of :func:`.buckets.mechanism` where every
    seed has such tokens (how often rare tokens were clipped on each side, how far those with :math:`A < 0` /
    :math:`A > 0` moved per batch), also compared against clip under ``paired``.

    Every entry holds ``n``, ``mean``, ``std``, ``se``, the 95 % Student-t interval ``ci`` and its
    ``ci_half_width``, and ``per_seed``.  ``paired``: for every method but the first, its per-seed difference
    from the first (``clip``) on the same warm-up and random streams (:func:`.stats.paired_difference`: the
    paired t interval, ``ahead`` / ``behind`` seeds, ``t`` and ``p``); the reference itself has no entry.
    ``start`` describes the warmed-up policy and ``regime`` states what the comparison models (rarity of the
    rewarded strategy, open decisions, ratio movement).
    """
    methods: dict[str, Any] = {}
    per_seed: dict[str, dict[str, list[float]]] = {}
    for name, seed_runs in runs.items():
        finals = [lines[-1] for lines in seed_runs]
        values = {key: [line[field] for line in finals] for key, field in SUMMARY_FIELDS.items()}
        steps = [[line for line in lines if line["step"] > 0] for lines in seed_runs]
        values["reward_auc"] = [float(np.mean([s["reward"] for s in lines])) for lines in steps]
        for field in ("reward", "entropy"):
            thirds = [[float(part.mean()) for part in np.array_split([s[field] for s in lines], len(WINDOWS))]
                      for lines in steps]
            for i, window in enumerate(WINDOWS):
                values[f"{field}_{window}"] = [seed[i] for seed in thirds]
        values["clipfrac"] = [float(np.mean([s["clipfrac"] for s in lines])) for lines in steps]
        values["abs_log_ratio"] = [float(np.mean([s["final_abs_log_ratio"] for s in lines])) for lines in steps]
        rare = [mechanism(lines) for lines in steps]
        for key in MECHANISM_FIELDS:  # only where every seed has such tokens (e.g. rare tokens with A > 0)
            if all(r[key] is not None for r in rare):
                values[key] = [r[key] for r in rare]
        if all("band_cost_frac" in s for lines in steps for s in lines):
            values["band_cost_frac"] = [float(np.mean([s["band_cost_frac"] for s in lines])) for lines in steps]
        per_seed[name] = values
        methods[name] = {key: mean_ci(v) for key, v in values.items()}

    reference = next(iter(runs))
    paired = {name: {key: paired_difference(per_seed[name][key], per_seed[reference][key])
                     for key in (*PAIRED_FIELDS, *MECHANISM_FIELDS)
                     if key in per_seed[name] and key in per_seed[reference]}
              for name in runs if name != reference}

    starts = [lines[0] for lines in runs[reference]]
    start_fields = {**SUMMARY_FIELDS, **START_FIELDS}
    start = {key: mean_ci([line[field] for line in starts]) for key, field in start_fields.items()
             if all(field in line for line in starts)}
    regime = {
        "task": base.task,
        "reward_mode": base.reward,
        "demo_correct": base.demo_correct,
        "updates_per_batch": base.ppo_epochs * base.minibatches,
        "lr": base.lr,
        "steps": base.steps,
        "batch": base.prompts_per_step * base.group_size,
        **{f"start_{key}": start[key]["mean"] for key in ("answer_prob", "first_token_prob", "accuracy",
                                                          "fork_frac") if key in start},
        "abs_log_ratio": {name: entry["abs_log_ratio"]["mean"] for name, entry in methods.items()},
        "clipfrac": {name: entry["clipfrac"]["mean"] for name, entry in methods.items()},
    }
    return {
        "methods": methods,
        "paired": {"reference": reference, **paired},
        "start": start,
        "regime": regime,
        "task": base.task,
        "reward_mode": base.reward,
        "seeds": seeds,
        "ci_level": CI_LEVEL,
        "ci_method": "Student t over seeds (n - 1 degrees of freedom); paired t for differences",
        "eval_k": base.eval_k,
        "config": {k: v for k, v in dataclasses.asdict(base).items()
                   if k not in {key for preset in METHOD_PRESETS.values() for key in preset}},
        "method_presets": METHOD_PRESETS,
    }


def render_markdown(summary: dict[str, Any]) -> str:
    """``summary.md``: the command, then per method mean ± 95 % half-width, then the paired differences."""
    k, seeds, level = summary["eval_k"], summary["seeds"], round(100 * summary.get("ci_level", CI_LEVEL))
    headers = [header.format(k=k) for header in TABLE_COLUMNS.values()]
    det = summary.get("determinism", {})
    lines = [
        f"`{summary.get('command', 'bandcore train --compare')}`",
        "",
        f"{seeds} seeds, {summary['config']['steps']} RL steps, task `{summary['task']}` "
        f"({summary['reward_mode']} reward), torch threads {det.get('torch_threads', '?')}, deterministic "
        f"algorithms {det.get('deterministic_algorithms', '?')}. Mean ± half-width of the {level} % confidence "
        f"interval over seeds (Student t, {seeds - 1} degrees of freedom).",
        "",
        "| method | " + " | ".join(headers) + " |",
        "| --- |" + " --- |" * len(headers),
    ]
    for name, entry in summary["methods"].items():
        lines.append(f"| {name} | " + " | ".join(format_mean(entry[key]) for key in TABLE_COLUMNS) + " |")
    reference = summary["paired"]["reference"]
    lines += [
        "",
        f"Paired differences against {reference} (same warm-up and random streams per seed): mean difference "
        f"[{level} % paired t interval] (seeds on which the method is higher / seeds); * marks an interval "
        "that excludes 0.",
        "",
        "| difference | " + " | ".join(headers) + " |",
        "| --- |" + " --- |" * len(headers),
    ]
    for name, entry in summary["paired"].items():
        if name != "reference":
            lines.append(f"| {name} − {reference} | " + " | ".join(format_diff(entry[key]) for key in TABLE_COLUMNS)
                         + " |")
    keys = [key for key in MECHANISM_TABLE if all(key in entry for entry in summary["methods"].values())]
    if keys:
        lines += ["", "Rare tokens (old probability p < 0.01) and common ones (p ≥ 0.5) over the run: fraction "
                  "clipped on each side; mean log r after a batch's updates of rare tokens with A < 0.", "",
                  "| method | " + " | ".join(MECHANISM_FIELDS[key] for key in keys) + " |",
                  "| --- |" + " --- |" * len(keys)]
        for name, entry in summary["methods"].items():
            lines.append(f"| {name} | " + " | ".join(format_mean(entry[key]) for key in keys) + " |")
        for name, entry in summary["paired"].items():
            if name != "reference":
                lines.append(f"| {name} − {reference} | " + " | ".join(format_diff(entry[key]) for key in keys)
                             + " |")
    return "\n".join(lines) + "\n"


def plot_curves(runs: dict[str, list[list[dict[str, Any]]]], out: str | Path) -> list[Path]:
    """``reward.png``, ``entropy.png``, ``clipfrac.png``: mean and its 95 % t interval over seeds per step (Agg)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    paths = []
    for stem, (field, label) in CURVES.items():
        figure = Figure(figsize=(6.0, 3.8), dpi=110)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        for name, seed_runs in runs.items():
            rows = [[line for line in lines if line["step"] > 0] for lines in seed_runs]
            steps = np.array([line["step"] for line in rows[0]])
            values = np.array([[line[field] for line in lines] for lines in rows])
            mean = values.mean(axis=0)
            half = np.zeros_like(mean)
            if len(values) > 1:
                half = t_quantile(CI_LEVEL, len(values) - 1) * values.std(axis=0, ddof=1) / np.sqrt(len(values))
            axes.plot(steps, mean, label=name)
            axes.fill_between(steps, mean - half, mean + half, alpha=0.2)
        axes.set_xlabel("RL step")
        axes.set_ylabel(label)
        axes.set_title(f"{label} (mean, {round(100 * CI_LEVEL)} % CI over {len(next(iter(runs.values())))} seeds)",
                       fontsize=9)
        axes.legend(fontsize=8)
        figure.tight_layout()
        path = Path(out) / f"{stem}.png"
        figure.savefig(path)
        paths.append(path)
    return paths


def _progress(enabled: bool, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="compare", unit="run", dynamic_ncols=True)

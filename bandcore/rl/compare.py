r"""``bandcore train --compare``: clip, clip-higher and band-kl with identical seeds and budgets.

For each seed the first method runs the warm-up; every other method starts from its ``warmup.pt`` (same
policy, same random streams), so the methods differ only in their ratio bounds:

- ``clip``: :math:`[1-\varepsilon, 1+\varepsilon]`, :math:`\varepsilon = 0.2`;
- ``clip-higher``: :math:`[0.8, 1.28]`;
- ``band-kl``: the Band of :math:`KL(\pi_{old}\|\pi) \le \delta`, :math:`\delta = 0.05`.

Writes ``DIR/runs/<method>/seed<k>/metrics.jsonl``, ``DIR/summary.json`` (final evaluation per method: mean,
standard deviation and the per-seed values) and ``DIR/reward.png``, ``DIR/entropy.png``, ``DIR/clipfrac.png``
(mean ± one standard deviation over seeds against the RL step).  ``--resume`` skips finished runs and
continues interrupted ones.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from .train import METHOD_PRESETS, METRICS_FILE, WARMUP_FILE, TrainConfig, read_metrics, run

__all__ = ["BUDGETS", "compare", "plot_curves", "summarise"]

#: The budgets of ``--compare`` (``--quick`` and the default); command-line options override them.
BUDGETS: dict[str, dict[str, Any]] = {
    "quick": {"steps": 30},
    "full": {"steps": 80},
}

#: Final-evaluation fields reported in summary.json (name in the summary -> metrics field).
SUMMARY_FIELDS = {
    "reward": "eval_reward",
    "entropy": "eval_entropy",
    "pass_at_k": "eval_pass_at_k",
    "accuracy": "eval_accuracy",
}
#: Curves: file stem -> (metrics field, y label).
CURVES = {
    "reward": ("reward", "mean reward of the batch"),
    "entropy": ("entropy", "mean token entropy (nat)"),
    "clipfrac": ("clipfrac", "fraction of tokens clipped"),
}


def compare(out: str | Path, *, overrides: dict[str, Any] | None = None, seeds: int = 3, quick: bool = False,
            resume: bool = False, progress: bool = True, threads: int | None = 1) -> dict[str, Any]:
    """Train every method of :data:`METHOD_PRESETS` for ``seeds`` seeds; write the summary and the plots.

    Parameters
    ----------
    out : output directory.
    overrides : :class:`TrainConfig` fields that replace the budget's (e.g. ``{"steps": 5}``); the loss fields
        (method, divergence, delta, clip_eps, clip_eps_high) are set per method and may not be given.
    seeds : number of seeds (``seed``, ``seed + 1``, ...), at least 1 (3 or more for a spread worth quoting).
    quick : use the ``quick`` budget instead of ``full``.
    resume : keep finished runs, continue unfinished ones.

    Returns
    -------
    The summary (also written to ``out/summary.json``).
    """
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds: must be a positive integer, got {seeds!r}")
    overrides = dict(overrides or {})
    per_method = {key for preset in METHOD_PRESETS.values() for key in preset}
    clash = sorted(per_method & overrides.keys())
    if clash:
        raise ValueError(f"compare: {clash} are set per method and cannot be overridden")
    base = TrainConfig(**{**BUDGETS["quick" if quick else "full"], **overrides})
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in METHOD_PRESETS}
    jobs = [(k, name) for k in range(seeds) for name in METHOD_PRESETS]
    bar = _progress(progress, len(jobs))
    for k, name in jobs:
        config = dataclasses.replace(base, seed=base.seed + k, **{"clip_eps_high": None, **METHOD_PRESETS[name]})
        directory = out / "runs" / name / f"seed{config.seed}"
        first_method = next(iter(METHOD_PRESETS))
        warm_start = None if name == first_method else out / "runs" / first_method / f"seed{config.seed}" / WARMUP_FILE
        if not (resume and _finished(directory, config.steps)):
            if not resume and (directory / METRICS_FILE).exists():
                (directory / METRICS_FILE).unlink()  # a fresh comparison replaces an older one
            run(config, directory, resume=resume, warm_start=warm_start, progress=False, threads=threads)
        runs[name].append(read_metrics(directory / METRICS_FILE))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()

    summary = summarise(runs, base, seeds)
    summary["wall_time_s"] = time.perf_counter() - started
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_curves(runs, out)
    return summary


def _finished(directory: Path, steps: int) -> bool:
    path = directory / METRICS_FILE
    if not path.exists():
        return False
    lines = read_metrics(path)
    return bool(lines) and lines[-1]["step"] == steps and "eval_reward" in lines[-1]


def _spread(values: list[float]) -> dict[str, Any]:
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std(ddof=1)) if array.size > 1 else 0.0,
            "per_seed": [float(v) for v in array]}


def summarise(runs: dict[str, list[list[dict[str, Any]]]], base: TrainConfig, seeds: int) -> dict[str, Any]:
    """The summary: per method the final evaluation (mean, std over seeds, per seed) plus training statistics.

    Besides the final ``reward``, ``entropy``, ``pass_at_k`` and ``accuracy`` (of the fixed evaluation set,
    ``eval_k`` samples per prompt) each method reports ``clipfrac`` (mean over the run), ``abs_log_ratio``
    (mean over the run of the mean |log r| after the last update of a batch: how far the ratio moves per
    batch) and, for the Band, ``band_cost_frac`` (mean over the run).  ``start`` describes the warmed-up
    policy (the regime: accuracy, pass@k, entropy, fraction of open decisions).
    """
    methods: dict[str, Any] = {}
    for name, seed_runs in runs.items():
        finals = [lines[-1] for lines in seed_runs]
        entry = {key: _spread([line[field] for line in finals]) for key, field in SUMMARY_FIELDS.items()}
        steps = [[line for line in lines if line["step"] > 0] for lines in seed_runs]
        entry["clipfrac"] = _spread([float(np.mean([s["clipfrac"] for s in lines])) for lines in steps])
        entry["abs_log_ratio"] = _spread([float(np.mean([s["final_abs_log_ratio"] for s in lines]))
                                          for lines in steps])
        if all("band_cost_frac" in s for lines in steps for s in lines):
            entry["band_cost_frac"] = _spread([float(np.mean([s["band_cost_frac"] for s in lines]))
                                               for lines in steps])
        methods[name] = entry
    starts = [lines[0] for lines in next(iter(runs.values()))]
    start = {key: _spread([line[field] for line in starts])
             for key, field in {**SUMMARY_FIELDS, "fork_frac": "eval_fork_frac"}.items()}
    return {
        "methods": methods,
        "start": start,
        "task": base.task,
        "reward_mode": base.reward,
        "seeds": seeds,
        "eval_k": base.eval_k,
        "config": {k: v for k, v in dataclasses.asdict(base).items()
                   if k not in {key for preset in METHOD_PRESETS.values() for key in preset}},
        "method_presets": METHOD_PRESETS,
    }


def plot_curves(runs: dict[str, list[list[dict[str, Any]]]], out: str | Path) -> list[Path]:
    """``reward.png``, ``entropy.png``, ``clipfrac.png``: mean ± std over seeds against the step (Agg)."""
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
            std = values.std(axis=0, ddof=1) if len(values) > 1 else np.zeros_like(mean)
            axes.plot(steps, mean, label=name)
            axes.fill_between(steps, mean - std, mean + std, alpha=0.2)
        axes.set_xlabel("RL step")
        axes.set_ylabel(label)
        axes.set_title(f"{label} (mean ± std over {len(next(iter(runs.values())))} seeds)", fontsize=9)
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

r"""``bandcore train --sweep``: a mechanism map -- where the Band keeps entropy above clip's, where it lowers it.

The hypothesis.  For the KL Band a token of old probability :math:`p \ll \delta` has the bounds
:math:`l \approx e^{-1-\delta/p} \approx 0` and :math:`u \approx 1/p` (e.g. :math:`p = 0.005`, :math:`\delta =
0.05`: :math:`[1.7\cdot 10^{-5}, 13]`), a fixed clip :math:`[0.8, 1.2]` for every token.  So a rare token with
negative advantage can be pushed down almost to 0 in one batch where clip stops it at 0.8 (mass moves to the
dominant token: entropy falls faster), and a rare token with positive advantage can grow up to :math:`1/p` where
clip stops it at 1.2 (mass moves to rare tokens: entropy rises, the rewarded branch is learned sooner).

The grid (the ``reverse`` task, exact reward, the ``--compare`` regime of 16 Adam steps per batch):

- rarity of the rewarded answer: ``demo_correct`` in :data:`RARITIES` (share of reversals in the warm-up's habit
  phase; π(answer) at the start is recorded per cell);
- dominance of the mediocre answer: ``demo_noise`` in :data:`NOISES`; the habit phase copies the string in a
  fraction :math:`1 - \text{demo\_correct} - \text{demo\_noise}` of its demonstrations (the rest are copies with
  one random digit, which leaves more probability on other digits);
- the ratio bounds, :data:`VARIANTS`: ``clip`` (ε = 0.2), the KL Band at three δ (δ = 0.02 matches clip's
  [0.8, 1.2] at p = 0.5), and two halves of the Band at δ = 0.05: ``band-upper`` (its upper bound, lower bound
  floored at 0.8: ``min_ratio``) and ``band-lower`` (its lower bound, upper bound capped at 1.2: ``max_ratio``).

Per cell and seed the ``clip`` run does the warm-up and every other variant starts from its ``warmup.pt`` (same
policy, same random streams), so each seed is a paired comparison against clip.  Per run: ``entropy_late``
(mean batch entropy over the last third of the RL steps), ``entropy_final`` (final evaluation), ``reward_auc``
(mean batch reward over the run), ``reward_final``; the mechanism, token-weighted over the run: the fraction of
rare (:math:`p < 0.01`) tokens clipped below and above, and the mean :math:`\log r` after a batch's updates of
rare tokens with :math:`A < 0` and :math:`A > 0` (:mod:`.buckets`).  Per cell and variant, and pooled over
all cells: the mean and 95 % Student-t interval, and the paired difference from clip with its paired t interval
(:mod:`.stats`).

Writes ``DIR/runs/<cell>/<variant>/seed<k>/``, ``DIR/sweep.json``, ``DIR/sweep.md`` and ``DIR/mechanism.png``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from .buckets import mechanism
from .compare import REGIME
from .config import TrainConfig
from .stats import CI_LEVEL, format_diff, format_mean, mean_ci, paired_difference
from .train import METRICS_FILE, RUN_FILES, WARMUP_FILE, read_metrics, run, run_finished

__all__ = ["NOISES", "RARITIES", "VARIANTS", "plot_sweep", "render_sweep", "run_metrics", "sweep"]

#: Share of correct demonstrations in the habit phase (how rare the rewarded answer starts).
RARITIES = (0.01, 0.03, 0.1)
#: Share of noisy copies in the habit phase (the rest are exact copies: how dominant the mediocre answer is).
NOISES = (0.05, 0.35)
#: Ratio bounds compared: name -> TrainConfig loss fields.  The first is the reference of the paired differences.
VARIANTS: dict[str, dict[str, Any]] = {
    "clip": {"method": "clip", "clip_eps": 0.2},
    "band δ=0.02": {"method": "band", "divergence": "kl", "delta": 0.02},
    "band δ=0.05": {"method": "band", "divergence": "kl", "delta": 0.05},
    "band δ=0.1": {"method": "band", "divergence": "kl", "delta": 0.1},
    "band-upper δ=0.05": {"method": "band", "divergence": "kl", "delta": 0.05, "min_ratio": 0.8},
    "band-lower δ=0.05": {"method": "band", "divergence": "kl", "delta": 0.05, "max_ratio": 1.2},
}
#: The sweep's budget (the ``--compare`` regime, shorter runs); command-line settings override it.
BUDGET: dict[str, Any] = {**REGIME, "steps": 30}
SEEDS = 3
#: Fields set by the grid, which may not be overridden.
GRID_FIELDS = ("demo_correct", "demo_noise", "method", "divergence", "delta", "clip_eps", "clip_eps_high",
               "min_ratio", "max_ratio")
#: Per-run metrics compared against clip.
PAIRED = ("entropy_late", "entropy_final", "reward_auc", "reward_final")
#: Columns of the pooled table of sweep.md.
POOLED_COLUMNS = {"entropy_late": "Δ entropy, last third (nat)", "entropy_final": "Δ final entropy (nat)",
                  "reward_auc": "Δ reward AUC", "reward_final": "Δ final reward"}


def _cell(rarity: float, noise: float) -> str:
    return f"correct{rarity:g}-noise{noise:g}"


def _dir_name(variant: str) -> str:
    return variant.replace(" ", "_").replace("δ=", "delta")


def sweep(out: str | Path, *, overrides: dict[str, Any] | None = None, seeds: int = SEEDS,
          rarities: tuple[float, ...] = RARITIES, noises: tuple[float, ...] = NOISES,
          variants: tuple[str, ...] | None = None, resume: bool = False, new_run: bool = False,
          progress: bool = True, threads: int | None = 1) -> dict[str, Any]:
    """Train every variant on every cell of the grid for ``seeds`` seeds; write sweep.json, sweep.md, the plot.

    ``overrides`` replace :data:`BUDGET`'s settings (not :data:`GRID_FIELDS`); ``variants`` selects names of
    :data:`VARIANTS` (default all; ``clip`` is always run first, as the reference).  ``resume`` keeps finished
    runs and redoes the others; without ``resume`` or ``new_run`` a directory that holds a sweep is refused.
    """
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds: must be a positive integer, got {seeds!r}")
    overrides = dict(overrides or {})
    clash = sorted(set(GRID_FIELDS) & overrides.keys())
    if clash:
        raise ValueError(f"sweep: {clash} are set by the grid and cannot be overridden")
    chosen = ["clip", *[v for v in (variants or VARIANTS) if v != "clip"]]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise ValueError(f"variants: unknown {unknown}; choose from {list(VARIANTS)}")
    out = Path(out)
    base = TrainConfig(**{**BUDGET, **overrides})
    jobs = []
    for rarity in rarities:
        for noise in noises:
            cell = _cell(rarity, noise)
            for k in range(seeds):
                for name in chosen:
                    fields = {"demo_correct": rarity, "demo_noise": noise, "seed": base.seed + k,
                              "clip_eps_high": None, "min_ratio": None, "max_ratio": None, **VARIANTS[name]}
                    directory = out / "runs" / cell / _dir_name(name) / f"seed{base.seed + k}"
                    jobs.append((cell, name, dataclasses.replace(base, **fields), directory))
    held = [d for _, _, _, d in jobs if any((d / f).exists() for f in RUN_FILES)]
    if (held or (out / "sweep.json").exists()) and not (resume or new_run):
        raise ValueError(f"out: {str(out)!r} already holds a sweep; pass --resume to continue it, --new-run to "
                         "replace it, or choose a new --out")
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    bar = _progress(progress, len(jobs))
    lines: dict[str, dict[str, list[list[dict[str, Any]]]]] = {}
    for cell, name, config, directory in jobs:
        reference = directory.parent.parent / _dir_name("clip") / directory.name / WARMUP_FILE
        if not (resume and run_finished(directory, config.steps)):
            run(config, directory, new_run=True, warm_start=None if name == "clip" else reference,
                progress=False, threads=threads)
        lines.setdefault(cell, {}).setdefault(name, []).append(read_metrics(directory / METRICS_FILE))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    result = summarise_sweep(lines, base, seeds)
    result["wall_time_s"] = time.perf_counter() - started
    (out / "sweep.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "sweep.md").write_text(render_sweep(result))
    plot_sweep(result, out / "mechanism.png")
    return result


def run_metrics(lines: list[dict[str, Any]]) -> dict[str, float | None]:
    r"""The per-run numbers of the sweep from a run's metric lines (line 0: the warmed-up policy).

    ``entropy_late`` :math:`= \frac{1}{|W|}\sum_{s \in W} H_s` over the last third :math:`W` of the steps;
    ``reward_auc`` :math:`= \frac1S \sum_s R_s`; ``entropy_final`` / ``reward_final`` from the final evaluation;
    ``start_answer_prob``: π(answer) after the warm-up; and the rare-token numbers of :func:`.buckets.mechanism`.
    """
    steps = [line for line in lines if line["step"] > 0]
    late = np.array_split(np.array([s["entropy"] for s in steps]), 3)[-1]
    final = lines[-1]
    return {
        "entropy_late": float(late.mean()),
        "entropy_final": final["eval_entropy"],
        "reward_auc": float(np.mean([s["reward"] for s in steps])),
        "reward_final": final["eval_reward"],
        "start_answer_prob": lines[0]["eval_answer_prob"],
        **mechanism(steps),
    }


def summarise_sweep(lines: dict[str, dict[str, list[list[dict[str, Any]]]]], base: TrainConfig,
                    seeds: int) -> dict[str, Any]:
    """Per cell and variant: :func:`.stats.mean_ci` of every :func:`run_metrics` number (over the seeds where it
    is defined) and, for all but clip, :func:`.stats.paired_difference` of :data:`PAIRED` against clip.

    ``pooled``: the same over every (cell, seed) pair of the grid at once -- each pair is one warm-up shared by
    all variants, so the paired t interval over the :math:`n_{cells} \times n_{seeds}` differences is the
    grid-wide effect (cells where nothing is learned contribute differences of exactly 0).
    """
    cells: dict[str, Any] = {}
    everything: dict[str, list[dict[str, Any]]] = {}
    for cell, by_variant in lines.items():
        numbers = {name: [run_metrics(r) for r in runs] for name, runs in by_variant.items()}
        for name, per_seed in numbers.items():
            everything.setdefault(name, []).extend(per_seed)
        entry: dict[str, Any] = {"variants": {}, "paired": {}}
        for name, per_seed in numbers.items():
            entry["variants"][name] = {
                key: mean_ci(values) for key in per_seed[0]
                if (values := [m[key] for m in per_seed if m[key] is not None])
            }
            if name != "clip":
                entry["paired"][name] = {key: paired_difference([m[key] for m in per_seed],
                                                                [m[key] for m in numbers["clip"]]) for key in PAIRED}
        entry["start_answer_prob"] = entry["variants"]["clip"]["start_answer_prob"]["mean"]
        cells[cell] = entry
    pooled = {name: {key: mean_ci(values) for key in per_run[0]
                     if (values := [m[key] for m in per_run if m[key] is not None])}
              for name, per_run in everything.items()}
    pooled_paired = {name: {key: paired_difference([m[key] for m in per_run], [m[key] for m in everything["clip"]])
                            for key in PAIRED} for name, per_run in everything.items() if name != "clip"}
    return {
        "cells": cells,
        "pooled": {"variants": pooled, "paired": pooled_paired},
        "variants": {name: VARIANTS[name] for name in next(iter(lines.values()))},
        "seeds": seeds,
        "ci_level": CI_LEVEL,
        "config": {k: v for k, v in dataclasses.asdict(base).items() if k not in GRID_FIELDS},
    }


def render_sweep(result: dict[str, Any]) -> str:
    """``sweep.md``: per cell the paired differences from clip, then the rare-token mechanism per variant."""
    cells, level = result["cells"], round(100 * result["ci_level"])
    names = [name for name in result["variants"] if name != "clip"]
    pooled, runs = result["pooled"], len(cells) * result["seeds"]
    out = [f"{len(cells)} cells × {result['seeds']} seeds, {result['config']['steps']} RL steps; mean difference "
           f"from clip [{level} % paired t interval] (runs higher / runs); * marks an interval that excludes 0.", "",
           f"All cells pooled ({runs} paired runs per variant):", "",
           "| variant | " + " | ".join(POOLED_COLUMNS.values()) + " |", "| --- |" + " --- |" * len(POOLED_COLUMNS)]
    for name in names:
        out.append(f"| {name} − clip | " + " | ".join(format_diff(pooled["paired"][name][key])
                                                       for key in POOLED_COLUMNS) + " |")
    out.append("")
    for key, title in (("entropy_late", "entropy over the last third (nat)"), ("reward_auc", "reward AUC")):
        out += [f"Δ {title}, variant − clip:", "", "| cell | π(answer) at start | " + " | ".join(names) + " |",
                "| --- | --- |" + " --- |" * len(names)]
        for cell, entry in cells.items():
            row = [format_diff(entry["paired"][name][key]) for name in names]
            out.append(f"| {cell} | {entry['start_answer_prob']:.3g} | " + " | ".join(row) + " |")
        out.append("")
    columns = {"clip_low_rare": "rare tokens clipped below", "clip_high_rare": "rare tokens clipped above",
               "log_ratio_neg_rare": "log r of rare tokens, A < 0",
               "log_ratio_pos_rare": "log r of rare tokens, A > 0", "entropy_late": "entropy, last third"}
    out += [f"Mechanism, all cells pooled: mean ± {level} % half-width over the runs where the tokens occur "
            "(p < 0.01: rare tokens; log r after a batch's updates; n: runs):", "",
            "| variant | " + " | ".join(columns.values()) + " |", "| --- |" + " --- |" * len(columns)]
    for name in result["variants"]:
        row = []
        for key in columns:
            entry = pooled["variants"][name].get(key)
            row.append(f"{format_mean(entry)} (n {entry['n']})" if entry and key != "entropy_late"
                       else format_mean(entry) if entry else "–")
        out.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def plot_sweep(result: dict[str, Any], path: str | Path) -> Path:
    """Δ entropy (last third) and Δ reward AUC against clip per cell and pooled, one marker per variant, 95 %
    paired t intervals."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cells = result["cells"]
    names = [name for name in result["variants"] if name != "clip"]
    figure = Figure(figsize=(9.0, 6.0), dpi=90)
    FigureCanvasAgg(figure)
    x = np.arange(len(cells) + 1)  # the cells, then all cells pooled
    for row, (key, label) in enumerate((("entropy_late", "Δ entropy, last third (nat)"),
                                        ("reward_auc", "Δ reward AUC"))):
        axes = figure.add_subplot(2, 1, row + 1)
        axes.axhline(0.0, color="grey", linewidth=0.8)
        for i, name in enumerate(names):
            offset = (i - (len(names) - 1) / 2) * 0.8 / max(len(names), 1)
            diffs = [*(cells[c]["paired"][name][key] for c in cells), result["pooled"]["paired"][name][key]]
            means = np.array([d["mean"] for d in diffs])
            half = np.array([d["ci_half_width"] or 0.0 for d in diffs])
            axes.errorbar(x + offset, means, yerr=half, fmt="o", markersize=4, capsize=2, label=name)
        axes.set_ylabel(label, fontsize=8)
        axes.set_xticks(x)
        labels = [*(c.replace("-", "\n").replace("correct", "correct ").replace("noise", "noise ")
                    + f"\nπ(ans) {cells[c]['start_answer_prob']:.2g}" for c in cells), "all cells\n(pooled)"]
        axes.set_xticklabels(labels if row else [], fontsize=7)
        axes.axvline(len(cells) - 0.5, color="grey", linewidth=0.5, linestyle=":")
        axes.tick_params(axis="y", labelsize=7)
    figure.axes[0].set_title(f"variant − clip, mean and {round(100 * result['ci_level'])} % paired t interval "
                             f"({result['seeds']} seeds per cell; pooled: {len(cells) * result['seeds']} runs)",
                             fontsize=9)
    handles, names_ = figure.axes[0].get_legend_handles_labels()
    figure.legend(handles, names_, loc="lower center", ncol=len(names), fontsize=7, frameon=False)
    figure.tight_layout(rect=(0.0, 0.04, 1.0, 1.0))
    figure.savefig(path)
    return Path(path)


def _progress(enabled: bool, total: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="sweep", unit="run", dynamic_ncols=True)

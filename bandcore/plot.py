r"""Figures of the Band (matplotlib, Agg backend): bounds against p, ratio bounds, clipped PPO regions.

* :func:`plot_bounds` — the allowed probability change :math:`\Delta\pi = p(r - 1)` against :math:`p` for PPO's
  fixed clip :math:`[1-\epsilon, 1+\epsilon]`, clip-higher :math:`[1-\epsilon_{lo}, 1+\epsilon_{hi}]` and the
  Band of several divergences, with the simplex limits :math:`\Delta\pi \le 1 - p` and :math:`\Delta\pi \ge -p`.
  Fixed clips give a tail token (small p) almost no room (:math:`\Delta\pi = \epsilon p`); the Band does.
* :func:`plot_ratio` — the ratio bounds :math:`r_{lo}(p), r_{up}(p)` on log–log axes, with :math:`r \le 1/p`.
* :func:`plot_region` — over :math:`(p, r)`, where the clipped surrogate
  :math:`\min(rA, \operatorname{clip}(r, r_{lo}, r_{up})A)` is flat (zero gradient), for :math:`A > 0` and
  :math:`A < 0`, Band against PPO.

Every function returns the :class:`matplotlib.figure.Figure` and, given ``out``, saves it (PNG or PDF, by the
file's extension).  Curves carry labels (``"Band: kl"``, ``"PPO clip ε=0.2"``) so their data can be checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .band import band
from .divergences import Divergence, resolve

__all__ = ["DEFAULT_DIVERGENCES", "FORMATS", "plot_bounds", "plot_ratio", "plot_region"]

DEFAULT_DIVERGENCES = ("kl", "tv", "pearson", "hellinger", "js")
FORMATS = (".png", ".pdf")
_P_MIN = 1e-4
_COLORS = plt.get_cmap("tab10").colors


def _p_grid(points: int = 400) -> np.ndarray:
    return np.logspace(np.log10(_P_MIN), np.log10(0.999), points)


def _resolve_all(divergences: Sequence[str | Divergence]) -> list[Divergence]:
    if isinstance(divergences, (str, Divergence)):
        divergences = [divergences]
    return [resolve(d) for d in divergences]


def _check(delta: float, eps: float, out: str | Path | None) -> None:
    if not (np.isfinite(delta) and delta > 0):
        raise ValueError(f"delta must be positive and finite, got delta={delta!r}")
    if not (0 < eps < 1):
        raise ValueError(f"eps must lie in (0, 1), got eps={eps!r}")
    if out is not None and Path(out).suffix.lower() not in FORMATS:
        raise ValueError(f"out must end in one of {FORMATS}, got out={str(out)!r}")


def _save(fig: Figure, out: str | Path | None) -> Figure:
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=150)
    return fig


def plot_bounds(
    delta: float = 0.05,
    divergences: Sequence[str | Divergence] = DEFAULT_DIVERGENCES,
    *,
    eps: float = 0.2,
    clip_higher: tuple[float, float] = (0.2, 0.28),
    out: str | Path | None = None,
) -> Figure:
    r"""Allowed change :math:`\Delta\pi = p(r-1)` vs p: PPO clip, clip-higher and the Band (paper's Figure 1)."""
    _check(delta, eps, out)
    chosen = _resolve_all(divergences)
    p = _p_grid()
    fig, (ax_up, ax_lo) = plt.subplots(1, 2, figsize=(12, 4.8), sharex=True)
    eps_lo, eps_hi = clip_higher
    for ax, side in ((ax_up, "upper"), (ax_lo, "lower")):
        sign = 1.0 if side == "upper" else -1.0
        limit = 1.0 - p if side == "upper" else -p
        ax.fill_between(p, limit, sign * 1.05, color="0.88", label="outside the simplex")
        ax.plot(p, limit, color="0.3", lw=1.2, label="simplex limit " + ("1 − p" if sign > 0 else "−p"))
        ax.plot(p, sign * eps * p, "k--", lw=1.5, label=f"PPO clip ε={eps:g}")
        higher = eps_hi if side == "upper" else eps_lo
        ax.plot(p, sign * higher * p, "k:", lw=1.8, label=f"clip-higher ε={eps_lo:g}/{eps_hi:g}")
        for color, div in zip(_COLORS, chosen, strict=False):
            lower, upper = band(np.log(p), div, delta)
            ratio = upper if side == "upper" else lower
            ax.plot(p, p * (ratio - 1.0), color=color, lw=2, label=f"Band: {div.name}")
        ax.set_xscale("log")
        ax.set_xlim(_P_MIN, 1)
        ax.set_ylim(*((0, 1.02) if sign > 0 else (-1.02, 0)))
        ax.set_xlabel("old probability p = π_old(a)")
        ax.grid(True, which="major", alpha=0.3)
    ax_up.set_ylabel("largest increase  Δπ = p(r_up − 1)")
    ax_lo.set_ylabel("largest decrease  Δπ = p(r_lo − 1)")
    ax_up.set_title("How much a token may gain")
    ax_lo.set_title("How much a token may lose")
    ax_up.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"Allowed probability change per token, δ = {delta:g}: fixed clips starve tail tokens")
    fig.tight_layout()
    return _save(fig, out)


def plot_ratio(
    delta: float = 0.05,
    divergences: Sequence[str | Divergence] = DEFAULT_DIVERGENCES,
    *,
    eps: float = 0.2,
    out: str | Path | None = None,
) -> Figure:
    """Ratio bounds r_lo(p) and r_up(p) on log–log axes, with PPO's 1 ± ε and the simplex limit 1/p."""
    _check(delta, eps, out)
    p = _p_grid()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.fill_between(p, 1.0 / p, 1e6, color="0.88", label="r > 1/p (outside the simplex)")
    ax.plot(p, 1.0 / p, color="0.3", lw=1.2, label="simplex limit r = 1/p")
    ax.plot(p, np.full_like(p, 1 + eps), "k--", lw=1.5, label=f"PPO clip 1 ± {eps:g}")
    ax.plot(p, np.full_like(p, 1 - eps), "k--", lw=1.5)
    for color, div in zip(_COLORS, _resolve_all(divergences), strict=False):
        lower, upper = band(np.log(p), div, delta)
        ax.plot(p, upper, color=color, lw=2, label=f"Band: {div.name}")
        ax.plot(p, lower, color=color, lw=2, ls="-.", label=f"Band lower: {div.name}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(_P_MIN, 1)
    ax.set_ylim(1e-3, 2.0 / _P_MIN)
    ax.set_xlabel("old probability p = π_old(a)")
    ax.set_ylabel("ratio r = π/π_old (solid: upper bound, dash-dot: lower bound)")
    ax.set_title(f"Band ratio bounds, δ = {delta:g} (lower bounds that saturate at 0 leave the plot)")
    ax.grid(True, which="major", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    keep = [i for i, label in enumerate(labels) if not label.startswith("Band lower")]
    ax.legend([handles[i] for i in keep], [labels[i] for i in keep], loc="upper right", fontsize=8)
    fig.tight_layout()
    return _save(fig, out)


def plot_region(
    divergence: str | Divergence = "kl",
    delta: float = 0.05,
    *,
    eps: float = 0.2,
    out: str | Path | None = None,
) -> Figure:
    r"""Where the clipped surrogate is flat over (p, r), for A > 0 (r > r_up) and A < 0 (r < r_lo).

    The surrogate :math:`\min(rA, \operatorname{clip}(r, r_{lo}, r_{up})A)` has zero gradient in r exactly
    when :math:`A > 0, r > r_{up}` or :math:`A < 0, r < r_{lo}`; shaded for the Band, hatched for PPO.
    """
    _check(delta, eps, out)
    div = resolve(divergence)
    p = _p_grid(300)
    r = np.logspace(-3, np.log10(2.0 / _P_MIN), 300)
    lower, upper = band(np.log(p), div, delta)
    pp, rr = np.meshgrid(p, r)
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    for ax, positive in zip(axes, (True, False), strict=True):
        bound = upper if positive else lower
        flat = rr > bound[None, :] if positive else rr < bound[None, :]
        region = np.where(rr > 1.0 / pp, 2.0, np.where(flat, 1.0, 0.0))
        ax.contourf(pp, rr, region, levels=[-0.5, 0.5, 1.5, 2.5], colors=["white", "#9ecae1", "0.85"])
        ax.plot(p, bound, color="#08519c", lw=2, label=f"Band ({div.name}) {'r_up' if positive else 'r_lo'}")
        ppo = np.full_like(p, 1 + eps if positive else 1 - eps)
        ppo_flat = (rr > 1 + eps if positive else rr < 1 - eps) & (rr <= 1.0 / pp)
        ax.contourf(pp, rr, ppo_flat.astype(float), levels=[0.5, 1.5], colors="none", hatches=["//"])
        ax.fill_between([], [], [], facecolor="none", hatch="//", edgecolor="k", label="clipped by PPO")
        ax.plot(p, ppo, "k--", lw=1.5, label=f"PPO clip {'1 + ε' if positive else '1 − ε'} (ε={eps:g})")
        ax.plot(p, 1.0 / p, color="0.3", lw=1, label="simplex limit r = 1/p")
        ax.plot([], [], color="#9ecae1", lw=8, label="clipped by the Band (zero gradient)")
        ax.plot([], [], color="0.85", lw=8, label="unreachable (π > 1)")
        ax.axhline(1.0, color="0.5", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(_P_MIN, 1)
        ax.set_ylim(r[0], r[-1])
        ax.set_xlabel("old probability p = π_old(a)")
        ax.set_title(f"advantage A {'> 0: clipped above r_up' if positive else '< 0: clipped below r_lo'}")
        ax.legend(loc="upper right", fontsize=8)
    axes[0].set_ylabel("ratio r = π/π_old")
    fig.suptitle(f"Clipped region of the PPO objective with the {div.name} Band, δ = {delta:g}")
    fig.tight_layout()
    return _save(fig, out)

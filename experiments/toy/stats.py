r"""Statistics of a seeded comparison: means with Student-t confidence intervals and paired differences.

For :math:`n` per-seed values :math:`x_1..x_n` (one number per seed, e.g. a method's final reward):

.. math::

    \bar x = \frac1n\sum_i x_i, \qquad s = \sqrt{\frac{1}{n-1}\sum_i (x_i - \bar x)^2}, \qquad
    \mathrm{SE} = \frac{s}{\sqrt n}, \qquad
    \mathrm{CI}_{1-\alpha} = \bar x \pm t_{1-\alpha/2,\,n-1}\,\mathrm{SE},

with :math:`t_{q,\nu}` the :math:`q` quantile of Student's t with :math:`\nu` degrees of freedom
(``scipy.stats.t.ppf``; :math:`t_{0.975,9} = 2.262`).  The interval assumes the seeds are independent draws and
the mean roughly normal; with 10 seeds it is a statement about the seed-to-seed spread of *this* toy, not about
other tasks.

Paired difference of a method against a reference on the same seeds (same warm-up, same random streams):
:math:`d_i = x_i - y_i`, summarised as above (the paired t interval), with the paired t statistic
:math:`t = \bar d / \mathrm{SE}_d`, its two-sided p-value :math:`2\,P(T_{n-1} > |t|)` (what
``scipy.stats.ttest_rel(x, y)`` returns) and the number of seeds with :math:`d_i > 0` (``ahead``) and
:math:`d_i < 0` (``behind``).  With :math:`n = 1` there is no spread: ``std`` is 0 and ``se``, ``ci``, ``t`` and
``p`` are ``None``; when all :math:`d_i` are equal the interval is the point :math:`[\bar d, \bar d]` and ``t``,
``p`` are ``None``.

Pure NumPy / SciPy; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["CI_LEVEL", "format_diff", "format_mean", "mean_ci", "paired_difference", "t_quantile"]

#: Confidence level of every interval in the comparison's summary.
CI_LEVEL = 0.95


def t_quantile(level: float, dof: int) -> float:
    r""":math:`t_{(1+\text{level})/2,\ \text{dof}}`: the two-sided critical value of Student's t."""
    from scipy import stats

    if not 0.0 < level < 1.0:
        raise ValueError(f"level: must be in (0, 1), got {level!r}")
    if dof < 1:
        raise ValueError(f"dof: must be a positive integer, got {dof!r}")
    return float(stats.t.ppf(0.5 + level / 2.0, dof))


def _values(values: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name}: must be a non-empty sequence of numbers, got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name}: must be finite, got {array.tolist()!r}")
    return array


def mean_ci(values: Sequence[float], level: float = CI_LEVEL) -> dict[str, Any]:
    r"""Mean, standard deviation, standard error and the Student-t confidence interval of ``values``.

    Returns ``{"n", "mean", "std", "se", "ci", "ci_half_width", "per_seed"}``: ``std`` is :math:`s` (ddof 1;
    0 for one value), ``se`` :math:`s/\sqrt n`, ``ci`` the pair :math:`\bar x \mp t_{(1+\text{level})/2,n-1}
    \mathrm{SE}` and ``ci_half_width`` :math:`t\,\mathrm{SE}`; ``se``, ``ci`` and ``ci_half_width`` are ``None``
    for one value.
    """
    x = _values(values, "values")
    n, mean = x.size, float(x.mean())
    entry: dict[str, Any] = {"n": n, "mean": mean, "std": 0.0, "se": None, "ci": None, "ci_half_width": None,
                             "per_seed": [float(v) for v in x]}
    if n > 1:
        std = float(x.std(ddof=1))
        se = std / math.sqrt(n)
        half = t_quantile(level, n - 1) * se
        entry.update(std=std, se=se, ci=[mean - half, mean + half], ci_half_width=half)
    return entry


def paired_difference(values: Sequence[float], reference: Sequence[float],
                      level: float = CI_LEVEL) -> dict[str, Any]:
    r"""The paired difference :math:`d_i = x_i - y_i` of ``values`` against ``reference`` (same seeds).

    :func:`mean_ci` of :math:`d` (the paired t interval), plus ``ahead`` (:math:`\#\{d_i > 0\}`), ``behind``
    (:math:`\#\{d_i < 0\}`), the paired t statistic ``t`` :math:`= \bar d / \mathrm{SE}_d` and its two-sided
    p-value ``p`` :math:`= 2 P(T_{n-1} > |t|)`; ``t`` and ``p`` are ``None`` when :math:`n = 1` or all
    :math:`d_i` are equal (to :math:`10^{-12}`).
    """
    from scipy import stats

    x, y = _values(values, "values"), _values(reference, "reference")
    if x.shape != y.shape:
        raise ValueError(f"values and reference: must have the same length (one per seed), got {x.size} and "
                         f"{y.size}")
    d = x - y
    entry = mean_ci(d, level)
    entry["ahead"], entry["behind"] = int((d > 0).sum()), int((d < 0).sum())
    entry["t"] = entry["p"] = None
    if d.size > 1 and entry["std"] > 1e-12:
        t = entry["mean"] / entry["se"]
        entry["t"], entry["p"] = float(t), float(2.0 * stats.t.sf(abs(t), d.size - 1))
    return entry


def format_mean(entry: dict[str, Any], digits: int = 3) -> str:
    """``"mean ± half-width"`` of a :func:`mean_ci` entry (``"mean"`` alone for one seed)."""
    if entry["ci_half_width"] is None:
        return f"{entry['mean']:.{digits}f}"
    return f"{entry['mean']:.{digits}f} ± {entry['ci_half_width']:.{digits}f}"


def format_diff(entry: dict[str, Any], digits: int = 3) -> str:
    """``"+mean [low, high] (ahead/n higher)"`` of a :func:`paired_difference` entry.

    ``*`` marks an interval that excludes 0 (not a point interval of equal differences, which has no t).
    """
    mean = f"{entry['mean']:+.{digits}f}"
    count = f"({entry['ahead']}/{entry['n']} higher)"
    if entry["ci"] is None:
        return f"{mean} {count}"
    low, high = entry["ci"]
    star = " *" if entry.get("t") is not None and (low > 0.0 or high < 0.0) else ""
    return f"{mean} [{low:+.{digits}f}, {high:+.{digits}f}] {count}{star}"

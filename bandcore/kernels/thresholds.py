r"""The saturation thresholds of the closed forms as double-double logarithms, so that saturation is decided exactly.

TV's lower bound saturates iff :math:`p \le \delta`, i.e. iff :math:`\log p \le \log\delta`. The input is the float
:math:`\log p` and :math:`\log\delta` is irrational: next to :math:`\mathrm{fl}(\log\delta)` the decision, and the
bound :math:`1 - e^{x}` with :math:`x = \log\delta - \log p`, depend on digits of :math:`\log\delta` beyond the
53rd. Each threshold :math:`\ell = \log p^*` is therefore handed to the solver as an unevaluated sum
``hi + lo`` of two floats (``hi`` the correctly rounded :math:`\ell`, ``lo`` the rest, rounded), from a
40-digit :mod:`decimal` logarithm of the exact value of the float δ: :math:`(\mathrm{hi} - \log p) + \mathrm{lo}`
is then the distance :math:`\ell - \log p` to one rounding (the first difference is exact next to the
threshold, Sterbenz) and its sign is exact.

Computed once per (kind, δ) on the host and passed to the closed forms (:mod:`.solvers.closed`) in the place of
a seed table (``fm[0:4]``, in the order of :data:`THRESHOLD_SLOTS`): no solver evaluates a logarithm of δ in
extended precision per token or per block.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from functools import lru_cache

import numpy as np

from .grid import KernelBound

__all__ = ["THRESHOLD_SLOTS", "threshold_logs", "threshold_seed"]

#: fm slots of a closed form's threshold table: log p*_lo (hi, lo), then log p*_up (hi, lo); a side that saturates
#: for every p has -inf (upper) or +inf (lower) as hi and 0 as lo
THRESHOLD_SLOTS = ("lower_hi", "lower_lo", "upper_hi", "upper_lo")


def _split(value: Decimal) -> tuple[float, float]:
    hi = float(value)
    return hi, float(value - Decimal(hi))


def threshold_logs(kind: str, delta: float) -> tuple[float, float, float, float]:
    r"""``(lower_hi, lower_lo, upper_hi, upper_lo)``: :math:`\log p^*` of each side as a double-double.

    ``"tv"``: :math:`p^*_{lo} = \delta`, :math:`p^*_{up} = 1 - \delta` (:math:`-\infty` for δ ≥ 1: every p
    saturates); ``"pearson"``: :math:`p^*_{lo} = \delta/(1+\delta)`, :math:`p^*_{up} = 1/(1+\delta)`. The lower
    bound saturates iff :math:`\log p \le \log p^*_{lo}`, the upper iff :math:`\log p \ge \log p^*_{up}`.
    """
    if kind not in ("tv", "pearson"):
        raise ValueError(f"kind must be 'tv' or 'pearson' (the closed forms), got {kind!r}")
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"delta must be finite and > 0, got {delta!r}")
    with localcontext() as context:
        context.prec = 40
        d = Decimal(delta)  # the float's exact value
        if kind == "tv":
            lower = _split(d.ln())
            upper = _split((1 - d).ln()) if d < 1 else (-math.inf, 0.0)
        else:
            log_one_plus = (1 + d).ln()
            lower = _split(d.ln() - log_one_plus)
            upper = _split(-log_one_plus)
    return (*lower, *upper)


@lru_cache(maxsize=256)
def threshold_seed(kind: str, delta: float) -> KernelBound:
    """:func:`threshold_logs` packed where a seeded solver's seed table goes (``fm[0:4]``; the table parts empty)."""
    return KernelBound(
        fmeta=np.array(threshold_logs(kind, delta)), imeta=np.zeros(4, dtype=np.int64),
        off=np.zeros(1, dtype=np.int64), levels=np.zeros(1, dtype=np.int64), cells=np.full((1, 6), math.nan),
    )  # fmt: skip

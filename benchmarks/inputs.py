r"""The token distributions ``bandcore bench`` times on, and the points its accuracy is measured at.

Three distributions of float32 log-probabilities :math:`\log p \le 0` (deterministic in the seed):

* ``llm`` (:func:`llm_like_log_probs`): a mixture like sampled LLM tokens, mostly confident ones;
* ``mid`` (:func:`mid_log_probs`): :math:`\log p = -2E`, :math:`E \sim \mathrm{Exp}(1)`, so
  :math:`P(p \le q) = q^{1/2}` (median :math:`p = e^{-2 \log 2} = 1/4`): mid-probability tokens;
* ``flat`` (:func:`flat_log_probs`): :math:`\log p = -U`, :math:`U \sim \mathrm{U}(0, 20)`, so
  :math:`P(p \le q) = 1 + \log(q)/20` for :math:`q \ge e^{-20}` (median :math:`p = e^{-10} \approx 4.5 \cdot
  10^{-5}`; 65 % of the tokens have :math:`p < 10^{-3}`): many rare tokens.

The published bisection solver's time depends on the distribution (its convergence test stops the bisection
once every bracket is narrow, and the bracket of :math:`r \in [1, 1/p]` starts :math:`1/p` wide), so the
benchmark reports each distribution separately.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["DISTRIBUTIONS", "accuracy_points", "flat_log_probs", "llm_like_log_probs", "log_probs", "mid_log_probs"]


def llm_like_log_probs(n: int, seed: int = 0) -> np.ndarray:
    r"""``n`` float32 log-probabilities distributed like sampled LLM tokens (deterministic in ``seed``).

    A three-part mixture, each part log-uniform:

    * 75 % confident tokens: :math:`1 - p \in [10^{-7}, 10^{-1}]` (so :math:`p > 0.9`),
      :math:`\log p = \mathrm{log1p}(-(1-p))`;
    * 20 % middle: :math:`p \in [10^{-3}, 0.9]`;
    * 5 % heavy tail: :math:`p \in [10^{-10}, 10^{-3}]`.

    Drawn with ``numpy.random.default_rng(seed)``, computed in float64 and rounded once to float32.
    """
    rng = np.random.default_rng(seed)
    part = rng.choice(3, size=n, p=[0.75, 0.20, 0.05])
    u = rng.random(n)
    log10_bounds = np.array([[-7.0, -1.0], [-3.0, np.log10(0.9)], [-10.0, -3.0]])
    lo, hi = log10_bounds[part, 0], log10_bounds[part, 1]
    value = 10.0 ** (lo + (hi - lo) * u)
    log_p = np.where(part == 0, np.log1p(-value), np.log(value))
    return np.minimum(log_p, 0.0).astype(np.float32)


def mid_log_probs(n: int, seed: int = 0) -> np.ndarray:
    r"""``n`` float32 log-probabilities :math:`\log p = -2E`, :math:`E \sim \mathrm{Exp}(1)` (deterministic in
    ``seed``; drawn with ``numpy.random.default_rng(seed)`` in float64 and rounded once to float32)."""
    rng = np.random.default_rng(seed)
    return (-2.0 * rng.standard_exponential(n)).astype(np.float32)


def flat_log_probs(n: int, seed: int = 0) -> np.ndarray:
    r"""``n`` float32 log-probabilities :math:`\log p = -U`, :math:`U \sim \mathrm{U}(0, 20)` (deterministic in
    ``seed``; drawn with ``numpy.random.default_rng(seed)`` in float64 and rounded once to float32)."""
    rng = np.random.default_rng(seed)
    return (-rng.uniform(0.0, 20.0, n)).astype(np.float32)


#: name -> (sampler, one-line description for the report)
DISTRIBUTIONS: dict[str, tuple[Callable[[int, int], np.ndarray], str]] = {
    "llm": (
        llm_like_log_probs,
        "log-uniform mixture like sampled LLM tokens: 75 % with 1 - p in [1e-7, 0.1], 20 % with p in "
        "[1e-3, 0.9], 5 % with p in [1e-10, 1e-3]",
    ),
    "mid": (mid_log_probs, "mid-probability tokens: log p = -2 E, E ~ Exp(1) (median p = 1/4)"),
    "flat": (flat_log_probs, "many rare tokens: log p = -U, U ~ Uniform(0, 20) (median p = e^-10; 65 % with p < 1e-3)"),
}


def log_probs(distribution: str, n: int, seed: int) -> np.ndarray:
    """``n`` float32 log-probabilities of the named distribution (a key of :data:`DISTRIBUTIONS`)."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}")
    return DISTRIBUTIONS[distribution][0](n, seed)


def accuracy_points(x: np.ndarray, m: int, seed: int) -> np.ndarray:
    """``m`` sorted float64 points: quantiles of ``x`` and log-uniform p over its range (float32-representable)."""
    rng = np.random.default_rng(seed + 1)
    quantiles = np.quantile(x.astype(np.float64), np.linspace(0.0, 1.0, m - m // 2))
    log10_p = np.log10(np.exp(np.array([x.min(), min(x.max(), -1e-7)], dtype=np.float64)))
    spread = np.log(10.0 ** rng.uniform(log10_p[0], log10_p[1], m // 2))
    return np.sort(np.concatenate([quantiles, spread]).astype(np.float32).astype(np.float64))

r"""A re-implementation of the published BandPO solver, the baseline of ``bandcore bench``.

Written from its published description only (the original code was not consulted): for the sampled token's
old probability :math:`p`, the upper ratio bound is found by bisection on :math:`r \in [1, 1/p]` and the lower
one on :math:`r \in [0, 1]`, 50 iterations at most, tolerance :math:`10^{-6}` on the bracket width, with a
host-side convergence check after every iteration (``if (hi - lo).max() < tol: break`` — a device→host
synchronisation in torch).  The KL constraint is evaluated directly,

.. math::  \mathrm{kl}(p, q) = p \log\frac{p}{q} + (1-p)\log\frac{1-p}{1-q}, \qquad q = p\,r,

and TV and Pearson χ² use their closed forms :math:`1 \pm \delta/p` and :math:`1 \pm \sqrt{\delta(1-p)/p}`,
clipped to :math:`[0, 1/p]`.

Implementation choices (ours, stated so the comparison is honest): torch, as the original, computing in its
input's dtype as the original does: trainers hold log-probs in float32, so ``bandcore bench`` times it on float32
tensors (its baseline) and, beside it, on the same log-probs as float64 tensors.  Bounds come back in the input's
dtype.

Accuracy (ε the dtype's machine epsilon: :math:`2^{-23}` in float32, :math:`2^{-52}` in float64):

* **Upper bound.**  The convergence test takes the widest bracket of the batch.  In float32 the floats above
  :math:`r = 16` are :math:`2^{-19} > 10^{-6}` apart, so a batch holding one token whose upper bound is
  :math:`\ge 16` (KL at δ = 0.05: :math:`p \lesssim 4 \cdot 10^{-3}`) runs all 50 iterations, its brackets ending
  one float apart; in float64 a batch runs all 50 when it holds a token with :math:`1/p - 1 \ge 2^{49} \cdot
  10^{-6}` (:math:`p \lesssim 1.8 \cdot 10^{-9}`).  After 50 halvings the bracket is :math:`2^{-50}(1/p - 1)`
  wide, :math:`\approx 2^{-50}/(1 - e^{-\delta})` relative to the bound for :math:`p \ll \delta`; where the test
  stops early, below :math:`10^{-6}`.  The constraint's own rounding moves the root by about
  :math:`\varepsilon/\delta` relative: the logs of ratios near 1 are off by about ε, over a slope
  :math:`r\,\partial\mathrm{kl}/\partial r \approx 1 - e^{-\delta}` for :math:`p \ll \delta`.  In float32 this
  dominates: :math:`\approx 2.4 \cdot 10^{-6}` relative at δ = 0.05 (float64: :math:`\sim 10^{-14}`, the
  bracket and the rounding alike).
* **Lower bound.**  Every bracket of :math:`[0, 1]` is :math:`2^{-k}` wide after :math:`k` halvings, so the test
  stops the bisection after 20 (:math:`2^{-20} < 10^{-6}`) in either dtype: the bound is the midpoint of its last
  bracket, within :math:`2^{-21} \approx 4.8 \cdot 10^{-7}` of the root (absolute), plus in float32 the
  constraint's rounding (a few times :math:`2^{-21}` at most, more at smaller δ).  A bound below
  :math:`2^{-21}` comes out as about :math:`2^{-21}`: KL's :math:`\approx e^{-1-\delta/p}` for
  :math:`p < \delta/13.6`.
* **TV, Pearson χ².**  Their closed forms are rounded in the input's dtype; in float32 the rounding of
  :math:`p = e^{\log p}` makes :math:`1 - p` relatively inexact near :math:`p = 1` (up to
  :math:`2^{-24}/(1-p)`), which Pearson's :math:`\sqrt{\delta(1-p)/p}` carries into its distance from 1.
"""

from __future__ import annotations

import torch

__all__ = ["PUBLISHED_DIVERGENCES", "published_band"]

#: Divergences the published solver supports.
PUBLISHED_DIVERGENCES = ("kl", "tv", "pearson")
_ITERATIONS = 50
_TOL = 1e-6


def _kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # xlogy keeps 0·log 0 = 0 at p = 1 (the published formula, made total)
    return torch.xlogy(p, p / q) + torch.xlogy(1 - p, (1 - p) / (1 - q))


def _bisect(p: torch.Tensor, delta: float, lo: torch.Tensor, hi: torch.Tensor, inside_is_lo: bool):
    for _ in range(_ITERATIONS):
        mid = (lo + hi) / 2
        feasible = _kl(p, p * mid) <= delta
        if inside_is_lo:  # upper bound: feasible side is [1, mid]
            lo = torch.where(feasible, mid, lo)
            hi = torch.where(feasible, hi, mid)
        else:  # lower bound: feasible side is [mid, 1]
            hi = torch.where(feasible, mid, hi)
            lo = torch.where(feasible, lo, mid)
        if (hi - lo).max() < _TOL:  # host-side convergence check (a device sync on GPU)
            break
    return (lo + hi) / 2


@torch.no_grad()
def published_band(old_log_prob: torch.Tensor, divergence: str, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(lower, upper) ratio bounds as the published solver computes them: in the input's dtype, every operation
    (float32 arithmetic on a float32 tensor, as trainers run it).

    Parameters
    ----------
    old_log_prob : torch.Tensor
        Floating-point log-probabilities :math:`\\log p \\le 0` of the sampled tokens under the old policy.
    divergence : {"kl", "tv", "pearson"}
        KL(π_old‖π) by bisection; total variation and Pearson χ² by their closed forms.
    delta : float
        Trust-region radius δ > 0.
    """
    if divergence not in PUBLISHED_DIVERGENCES:
        raise ValueError(f"divergence must be one of {PUBLISHED_DIVERGENCES} got {divergence!r}")
    p = old_log_prob.exp()
    if divergence == "kl":
        one = torch.ones_like(p)
        upper = _bisect(p, delta, one, 1 / p, inside_is_lo=True)
        lower = _bisect(p, delta, torch.zeros_like(p), one, inside_is_lo=False)
    else:
        half_width = delta / p if divergence == "tv" else torch.sqrt(delta * (1 - p) / p)
        upper = torch.minimum(1 + half_width, 1 / p)
        lower = torch.clamp(1 - half_width, min=0.0)
    return lower, upper

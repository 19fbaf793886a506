r"""A re-implementation of the published BandPO solver, the baseline of ``bandcore bench``.

Written from its published description only (the original code was not consulted): for the sampled token's
old probability :math:`p`, the upper ratio bound is found by bisection on :math:`r \in [1, 1/p]` and the lower
one on :math:`r \in [0, 1]`, 50 iterations at most, tolerance :math:`10^{-6}` on the bracket width, with a
host-side convergence check after every iteration (``if (hi - lo).max() < tol: break`` — a device→host
synchronisation in torch).  The KL constraint is evaluated directly,

.. math::  \mathrm{kl}(p, q) = p \log\frac{p}{q} + (1-p)\log\frac{1-p}{1-q}, \qquad q = p\,r,

and TV and Pearson χ² use their closed forms :math:`1 \pm \delta/p` and :math:`1 \pm \sqrt{\delta(1-p)/p}`,
clipped to :math:`[0, 1/p]`.

Implementation choices (ours, stated so the comparison is honest): torch, as the original; the input is cast
to float64 before solving and the bounds are cast back to the input dtype once (float64 favours the baseline's
accuracy; its 50 iterations dominate the time either way).  Accuracy: the bracket after 50 halvings is
:math:`2^{-50}/p` wide, so the upper bound is good to about :math:`10^{-6}` relative where the tolerance test
stops early and to :math:`\sim 10^{-15}/p` otherwise; lower bounds below about :math:`2^{-50}` cannot be
resolved at all (KL's lower bound :math:`\approx e^{-1-\delta/p}` for :math:`p \ll \delta`).
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
    """(lower, upper) ratio bounds as the published solver computes them, in the input's dtype.

    Parameters
    ----------
    old_log_prob : torch.Tensor
        Log-probabilities :math:`\\log p \\le 0` of the sampled tokens under the old policy.
    divergence : {"kl", "tv", "pearson"}
        KL(π_old‖π) by bisection; total variation and Pearson χ² by their closed forms.
    delta : float
        Trust-region radius δ > 0.
    """
    if divergence not in PUBLISHED_DIVERGENCES:
        raise ValueError(f"divergence must be one of {PUBLISHED_DIVERGENCES} got {divergence!r}")
    p = old_log_prob.to(torch.float64).exp()
    if divergence == "kl":
        one = torch.ones_like(p)
        upper = _bisect(p, delta, one, 1 / p, inside_is_lo=True)
        lower = _bisect(p, delta, torch.zeros_like(p), one, inside_is_lo=False)
    else:
        half_width = delta / p if divergence == "tv" else torch.sqrt(delta * (1 - p) / p)
        upper = torch.minimum(1 + half_width, 1 / p)
        lower = torch.clamp(1 - half_width, min=0.0)
    return lower.to(old_log_prob.dtype), upper.to(old_log_prob.dtype)

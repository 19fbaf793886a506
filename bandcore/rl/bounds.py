r"""Per-token ratio bounds :math:`(\log l, \log u)` for the clipped surrogate: the Band or a fixed clip.

For a sampled token with old log-probability :math:`\log p` the bounds depend on ``method``:

- ``"band"`` (BandPO): the Band of :math:`p`, the exact interval of ratios :math:`r = \pi/\pi_{old}` that keeps
  the whole next-token distribution inside the f-divergence trust region :math:`D_f(\pi\|\pi_{old}) \le \delta`
  (:func:`bandcore.band.band_log`); ``"kl"`` is :math:`KL(\pi_{old}\|\pi)`, BandPO's direction;
- ``"clip"`` (PPO/GRPO): :math:`[1-\varepsilon, 1+\varepsilon_{high}]`, :math:`\varepsilon_{high}` defaulting to
  :math:`\varepsilon`;
- ``"clip-higher"`` (DAPO): the same with :math:`\varepsilon_{high}` defaulting to 0.28.

``max_ratio`` caps :math:`u` for every method.  The bounds are returned as logarithms, so a saturated lower
bound (:math:`l = 0`, :math:`\log l = -\infty`) and a huge upper one (:math:`u = 1/p`) are represented exactly.

Domain of ``old_log_prob``: :math:`\log p \le 0`; values in :math:`(0, \tau]` with
:math:`\tau` = :data:`bandcore._contract.LOG_P_TOLERANCE` (1e-6) are rounding noise of a log-softmax and are read
as :math:`\log p = 0`; larger values raise :class:`ValueError` (``check=True``, one host synchronisation) or give
NaN bounds (``check=False``), for every method.  NaN gives NaN bounds.  :math:`\log p = -\infty` gives the
Band :math:`(-\infty, +\infty)` and the fixed clip's constant bounds.

This module imports torch only; the Band's solver (:mod:`bandcore.band`) is imported on the first ``"band"`` call.
"""

from __future__ import annotations

from typing import Any

import torch

from bandcore._contract import LOG_P_TOLERANCE

from .provider import CLIP_HIGHER_EPS, band_log_bounds, cap_upper, fixed_log_bounds
from .settings import METHODS, check_divergence, check_real, resolve_radii

__all__ = ["CLIP_HIGHER_EPS", "FIXED_CLIP", "METHODS", "check_bound_settings", "check_divergence", "check_real",
           "log_ratio_bounds"]

#: The fixed clip every metric is compared against: PPO's [0.8, 1.2].
FIXED_CLIP = (0.8, 1.2)


def check_bound_settings(
    *,
    method: str = "band",
    divergence: Any = "kl",
    delta: float | None = None,
    max_ratio: float | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    delta_low: float | None = None,
    delta_high: float | None = None,
) -> None:
    """Raise ``ValueError`` / ``TypeError`` naming the first bad setting of :func:`log_ratio_bounds`.

    The divergence is checked for every method (by :func:`bandcore.divergences.resolve_region`), the radii by
    :func:`bandcore.rl.settings.resolve_radii`; no tensor is touched.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if max_ratio is not None:
        check_real("max_ratio", max_ratio, above=1.0)
    check_real("clip_eps", clip_eps, below=1.0)
    if clip_eps_high is not None:
        check_real("clip_eps_high", clip_eps_high)
    low, high = resolve_radii(delta, delta_low, delta_high)
    check_divergence(divergence, low)  # raises, naming the spelling, if it is not a divergence
    if high != low:
        check_divergence(divergence, high)


def _raise_above_tolerance(values: torch.Tensor, name: str) -> None:
    beyond = values > LOG_P_TOLERANCE
    bad = values[beyond]
    raise ValueError(
        f"{name} must be <= 0 (log-probabilities; up to {LOG_P_TOLERANCE:g} is read as 0), "
        f"got {bad.numel()} value(s) above, e.g. {name}={float(bad[0])!r}"
    )


def _band_log(old_log_prob: torch.Tensor, divergence: Any, delta_low: float,
              delta_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    from bandcore.divergences import resolve_region

    try:
        div, low = resolve_region(divergence, delta_low)
        high = low if delta_high == delta_low else resolve_region(divergence, delta_high)[1]
    except ValueError:
        check_divergence(divergence, delta_low)  # a bad spelling: raise naming it (the grammar may quote a part)
        raise
    return band_log_bounds(old_log_prob, div, low, high)


def log_ratio_bounds(
    old_log_prob: torch.Tensor,
    *,
    method: str = "band",
    divergence: Any = "kl",
    delta: float | None = None,
    max_ratio: float | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    check: bool = True,
    delta_low: float | None = None,
    delta_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Per-token :math:`(\log l, \log u)` for ``method`` (see the module docstring), without gradient.

    Parameters
    ----------
    old_log_prob
        :math:`\log p` of the sampled tokens under the sampling policy, any shape, floating point.
    method
        ``"band"``, ``"clip"`` or ``"clip-higher"``.
    divergence
        The Band's f-divergence (any spelling :func:`bandcore.divergences.resolve_region` accepts, or a
        :class:`bandcore.Divergence`).
    delta, delta_low, delta_high
        Radii :math:`\delta > 0`: ``delta`` sets both sides (default 0.05); ``delta_low`` gives the lower bound
        :math:`l = r_{lo}(p, \delta_{low})`, ``delta_high`` the upper :math:`u = r_{up}(p, \delta_{high})`; a
        side not given takes ``delta``; ``delta`` with a side of another value raises ``ValueError``.
    max_ratio
        Optional cap :math:`u \le` ``max_ratio`` (> 1), for every method.
    clip_eps, clip_eps_high
        :math:`\varepsilon \in (0, 1)` and :math:`\varepsilon_{high} > 0` of the fixed clips.
    check
        Raise ``ValueError`` for :math:`\log p > 10^{-6}` (one host synchronisation); with ``False`` such entries
        give NaN bounds.

    Returns
    -------
    (log_lower, log_upper)
        Tensors shaped like ``old_log_prob``, same device and dtype; ``log_lower`` may be ``-inf``.
    """
    if not isinstance(old_log_prob, torch.Tensor):
        raise TypeError(f"old_log_prob must be a torch.Tensor, got {type(old_log_prob).__name__}")
    if not old_log_prob.is_floating_point():
        raise TypeError(f"old_log_prob must be a floating-point tensor, got dtype {old_log_prob.dtype}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if max_ratio is not None:
        max_ratio = check_real("max_ratio", max_ratio, above=1.0)
    old_log_prob = old_log_prob.detach()
    if check and old_log_prob.numel() and bool((old_log_prob > LOG_P_TOLERANCE).any()):
        _raise_above_tolerance(old_log_prob, "old_log_prob")
    if method == "band":
        low, high = resolve_radii(delta, delta_low, delta_high)
        log_lower, log_upper = _band_log(old_log_prob, divergence, low, high)
    else:
        eps = check_real("clip_eps", clip_eps, below=1.0)
        default_high = eps if method == "clip" else CLIP_HIGHER_EPS
        eps_high = check_real("clip_eps_high", default_high if clip_eps_high is None else clip_eps_high)
        log_lower, log_upper = fixed_log_bounds(old_log_prob, eps, eps_high)
    return log_lower, cap_upper(log_upper, max_ratio)

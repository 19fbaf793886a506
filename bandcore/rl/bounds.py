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

import math
from typing import Any

import torch

from bandcore._contract import LOG_P_TOLERANCE

__all__ = ["CLIP_HIGHER_EPS", "FIXED_CLIP", "METHODS", "check_bound_settings", "check_divergence", "log_ratio_bounds"]

METHODS = ("band", "clip", "clip-higher")
#: The fixed clip every metric is compared against: PPO's [0.8, 1.2].
FIXED_CLIP = (0.8, 1.2)
#: clip-higher's default ε_high (DAPO).
CLIP_HIGHER_EPS = 0.28


def check_real(name: str, value: Any, *, above: float = 0.0, below: float | None = None) -> float:
    """``value`` as a float with ``above < value`` (and ``value < below``); TypeError / ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > above):
        raise ValueError(f"{name} must be a finite number > {above:g}, got {value!r}")
    if below is not None and value >= below:
        raise ValueError(f"{name} must be in ({above:g}, {below:g}), got {value!r}")
    return value


def check_divergence(divergence: Any, delta: float = 0.05) -> Any:
    """The :class:`bandcore.Divergence` of ``divergence`` by :func:`bandcore.divergences.resolve_region`: a
    transform (``renyi(2)``) gives its f-divergence, and its radius ``delta`` is checked after the map.

    Its error is re-raised with the spelling in front when the message does not already quote it.
    """
    from bandcore.divergences import resolve_region

    try:
        return resolve_region(divergence, delta)[0]
    except ValueError as err:
        if isinstance(divergence, str) and divergence not in str(err):
            raise ValueError(f"divergence {divergence!r}: {err}") from None
        raise


def check_bound_settings(
    *,
    method: str = "band",
    divergence: Any = "kl",
    delta: float = 0.05,
    max_ratio: float | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> None:
    """Raise ``ValueError`` / ``TypeError`` naming the first bad setting of :func:`log_ratio_bounds`.

    The divergence is checked for every method (by :func:`bandcore.divergences.get_divergence`), δ by the Band's
    own check; no tensor is touched.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if max_ratio is not None:
        check_real("max_ratio", max_ratio, above=1.0)
    check_real("clip_eps", clip_eps, below=1.0)
    if clip_eps_high is not None:
        check_real("clip_eps_high", clip_eps_high)
    check_real("delta", delta)
    from bandcore._contract import check_delta

    check_delta(delta)
    check_divergence(divergence, delta)  # raises, naming the spelling, if it is not a divergence


def _raise_above_tolerance(values: torch.Tensor, name: str) -> None:
    beyond = values > LOG_P_TOLERANCE
    bad = values[beyond]
    raise ValueError(
        f"{name} must be <= 0 (log-probabilities; up to {LOG_P_TOLERANCE:g} is read as 0), "
        f"got {bad.numel()} value(s) above, e.g. {name}={float(bad[0])!r}"
    )


def _band_log(old_log_prob: torch.Tensor, divergence: Any, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    from bandcore.band import band_log

    try:
        # check=False: no host synchronisation; (0, tol] is read as 0, above tol and NaN give NaN
        return band_log(old_log_prob, divergence, delta, check=False)
    except ValueError:
        check_divergence(divergence, delta)  # a bad spelling: raise naming it (the grammar may quote only a part)
        raise


def log_ratio_bounds(
    old_log_prob: torch.Tensor,
    *,
    method: str = "band",
    divergence: Any = "kl",
    delta: float = 0.05,
    max_ratio: float | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Per-token :math:`(\log l, \log u)` for ``method`` (see the module docstring), without gradient.

    Parameters
    ----------
    old_log_prob
        :math:`\log p` of the sampled tokens under the sampling policy, any shape, floating point.
    method
        ``"band"``, ``"clip"`` or ``"clip-higher"``.
    divergence, delta
        The Band's f-divergence (any spelling :func:`bandcore.divergences.get_divergence` accepts, or a
        :class:`bandcore.Divergence`) and radius :math:`\delta > 0`.
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
        delta = check_real("delta", delta)
        log_lower, log_upper = _band_log(old_log_prob, divergence, delta)
    else:
        eps = check_real("clip_eps", clip_eps, below=1.0)
        default_high = eps if method == "clip" else CLIP_HIGHER_EPS
        eps_high = check_real("clip_eps_high", default_high if clip_eps_high is None else clip_eps_high)
        # NaN and log p above the tolerance give NaN, as for the Band
        invalid = torch.isnan(old_log_prob) | (old_log_prob > LOG_P_TOLERANCE)
        nan = torch.full_like(old_log_prob, math.nan)
        log_lower = torch.where(invalid, nan, math.log1p(-eps))
        log_upper = torch.where(invalid, nan, math.log1p(eps_high))
    if max_ratio is not None:
        log_upper = torch.clamp(log_upper, max=math.log(max_ratio))
    return log_lower, log_upper

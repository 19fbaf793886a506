r"""The Band policy loss: PPO's clipped surrogate with probability-aware (Band) ratio bounds.

For a sampled token with old log-probability :math:`\log p` (``old_log_prob``), new log-probability
:math:`\log \pi` (``log_prob``) and advantage :math:`A`:

.. math::

    \text{log\_ratio} = \log\pi - \log p, \qquad r = e^{\text{log\_ratio}}, \qquad
    \ell_{pg} = \max\bigl(-A\,r,\; -A\,\operatorname{clip}(r, l, u)\bigr),

and, with dual clip :math:`c > 1` (Ye et al. 2020), :math:`\ell_{pg} \leftarrow \min(\ell_{pg}, -A\,c)` where
:math:`A < 0`.  The bounds :math:`[l, u]` depend on ``method``:

- ``"band"`` (BandPO): the Band of :math:`p`, the exact interval of ratios that keeps the whole next-token
  distribution inside the f-divergence trust region :math:`D_f(\pi\|\pi_{old}) \le \delta`
  (:func:`bandcore.band_log`, see ``MATH.md``); ``"kl"`` is :math:`KL(\pi_{old}\|\pi)`, the paper's direction;
- ``"clip"`` (PPO/GRPO): :math:`[1-\varepsilon, 1+\varepsilon_{high}]`, :math:`\varepsilon_{high}` defaulting
  to :math:`\varepsilon`;
- ``"clip-higher"`` (DAPO): the same with :math:`\varepsilon_{high}` defaulting to 0.28.

``max_ratio`` caps :math:`u` for every method.  The bounds carry no gradient.  The comparison is done in log
space, :math:`\operatorname{clip}(r, l, u) = \exp(\operatorname{clamp}(\text{log\_ratio}, \log l, \log u))`,
so a saturated lower bound (:math:`\log l = -\infty`) or a huge upper bound (:math:`u = 1/p`) never overflows.
The ratio itself is not clamped (verl clamps the log-ratio to ±20; we do not change the gradient).

Reference: BandPO (Band-constrained policy optimisation); PPO (Schulman et al. 2017); DAPO (Yu et al. 2025);
Dr. GRPO (Liu et al. 2025).
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["LOSS_AGG_MODES", "METHODS", "aggregate_loss", "band_policy_loss", "log_ratio_bounds",
           "per_token_policy_loss"]

METHODS = ("band", "clip", "clip-higher")
LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                  "seq-mean-token-sum-norm")

#: The fixed clip every metric is compared against: PPO's [0.8, 1.2].
FIXED_CLIP = (0.8, 1.2)
#: clip-higher's default ε_high (DAPO).
CLIP_HIGHER_EPS = 0.28


def _check_positive_float(name: str, value: Any, *, above: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > above):
        raise ValueError(f"{name} must be a finite number > {above:g}, got {value!r}")
    return value


def _band_log(old_log_prob: torch.Tensor, divergence: Any, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``bandcore.band_log`` on a tensor; a temporary CPU bridge while its torch kernel is being written."""
    from bandcore.band import band_log

    try:
        # check=False: no host synchronisation (the caller clamps log p <= 0; NaN stays NaN)
        return band_log(old_log_prob, divergence, delta, check=False)
    except ModuleNotFoundError:
        lo, up = band_log(old_log_prob.cpu().to(torch.float64).numpy(), divergence, delta, backend="auto",
                          check=False)
        return torch.from_numpy(lo).to(old_log_prob), torch.from_numpy(up).to(old_log_prob)


def log_ratio_bounds(
    old_log_prob: torch.Tensor,
    *,
    method: str = "band",
    divergence: Any = "kl",
    delta: float = 0.05,
    max_ratio: float | None = None,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Per-token :math:`(\log l, \log u)` for ``method`` (see the module docstring), without gradient.

    Parameters
    ----------
    old_log_prob
        :math:`\log p` of the sampled tokens under the sampling policy, any shape, floating point.
        Values in :math:`(0, \text{tiny}]` from rounding are read as :math:`\log p = 0`; NaN stays NaN.
    method
        ``"band"``, ``"clip"`` or ``"clip-higher"``.
    divergence, delta
        The Band's f-divergence (name, alias or :class:`bandcore.Divergence`) and radius :math:`\delta > 0`.
    max_ratio
        Optional cap :math:`u \le` ``max_ratio`` (> 1), for every method.
    clip_eps, clip_eps_high
        :math:`\varepsilon \in (0, 1)` and :math:`\varepsilon_{high} > 0` of the fixed clips.

    Returns
    -------
    (log_lower, log_upper)
        Tensors shaped like ``old_log_prob``, same device and dtype; ``log_lower`` may be ``-inf``.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if max_ratio is not None:
        max_ratio = _check_positive_float("max_ratio", max_ratio, above=1.0)
    old_log_prob = old_log_prob.detach()
    if method == "band":
        delta = _check_positive_float("delta", delta)
        # log p <= 0; a log-softmax can round to a tiny positive value (clamp keeps NaN as NaN)
        log_lower, log_upper = _band_log(old_log_prob.clamp(max=0.0), divergence, delta)
    else:
        eps = _check_positive_float("clip_eps", clip_eps)
        if eps >= 1.0:
            raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps!r}")
        default_high = eps if method == "clip" else CLIP_HIGHER_EPS
        eps_high = _check_positive_float("clip_eps_high", default_high if clip_eps_high is None else clip_eps_high)
        nan = torch.isnan(old_log_prob)  # NaN in -> NaN out, as for the Band
        log_lower = torch.where(nan, old_log_prob, math.log1p(-eps))
        log_upper = torch.where(nan, old_log_prob, math.log1p(eps_high))
    if max_ratio is not None:
        log_upper = torch.clamp(log_upper, max=math.log(max_ratio))
    return log_lower, log_upper


def _check_inputs(log_prob, old_log_prob, advantages, mask) -> None:
    for name, value in (("log_prob", log_prob), ("old_log_prob", old_log_prob),
                        ("advantages", advantages), ("mask", mask)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    for name, value in (("log_prob", log_prob), ("old_log_prob", old_log_prob), ("advantages", advantages)):
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if log_prob.ndim != 2:
        raise ValueError(f"log_prob must have shape (B, T), got shape {tuple(log_prob.shape)}")
    shape = tuple(log_prob.shape)
    for name, value in (("old_log_prob", old_log_prob), ("mask", mask)):
        if tuple(value.shape) != shape:
            raise ValueError(f"{name} must have the shape of log_prob {shape}, got {tuple(value.shape)}")
    if tuple(advantages.shape) not in ((shape[0],), (shape[0], 1), shape):
        raise ValueError(
            f"advantages must have shape (B,), (B, 1) or (B, T) with (B, T) = {shape}, "
            f"got {tuple(advantages.shape)}"
        )
    if mask.is_complex():
        raise TypeError(f"mask must be a bool, integer or floating-point tensor, got dtype {mask.dtype}")
    for name, value in (("old_log_prob", old_log_prob), ("advantages", advantages), ("mask", mask)):
        if value.device != log_prob.device:
            raise ValueError(f"{name} is on {value.device} but log_prob is on {log_prob.device}")


def _masked_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    # an empty mask gives 0, not 0/0 = NaN
    return (values * weights).sum() / weights.sum().clamp_min(torch.finfo(weights.dtype).tiny)


def per_token_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    divergence: Any = "kl",
    delta: float = 0.05,
    dual_clip: float | None = None,
    max_ratio: float | None = None,
    method: str = "band",
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    log_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""The per-token clipped surrogate :math:`\ell_{pg}` (B, T), zero at masked positions, and the metrics.

    Same arguments as :func:`band_policy_loss` (without aggregation); used by the verl plug-in, which
    weights and aggregates the matrix itself.
    """
    _check_inputs(log_prob, old_log_prob, advantages, mask)
    if dual_clip is not None:
        dual_clip = _check_positive_float("dual_clip", dual_clip, above=1.0)
    # compute in at least fp32: bf16 ratios are too coarse for a clip test near 1
    dtype = torch.promote_types(torch.promote_types(log_prob.dtype, old_log_prob.dtype), torch.float32)
    valid = mask != 0
    weights = mask.to(dtype)
    # padding may hold anything (even NaN): replace it before any arithmetic so no NaN reaches a gradient
    old_log_prob = torch.where(valid, old_log_prob.detach().to(dtype), 0.0)
    advantages = advantages.detach().to(dtype)
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    advantages = torch.where(valid, advantages, 0.0)
    log_ratio = torch.where(valid, log_prob.to(dtype) - old_log_prob, 0.0)

    if log_bounds is None:
        log_bounds = log_ratio_bounds(
            old_log_prob, method=method, divergence=divergence, delta=delta, max_ratio=max_ratio,
            clip_eps=clip_eps, clip_eps_high=clip_eps_high,
        )
    elif any(b.shape != log_prob.shape for b in log_bounds):
        raise ValueError(f"log_bounds must be two tensors of shape {tuple(log_prob.shape)}, "
                         f"got {[tuple(b.shape) for b in log_bounds]}")
    # padding of precomputed bounds may hold anything: only real tokens' bounds are used
    log_lower, log_upper = (torch.where(valid, b.detach().to(dtype), 0.0) for b in log_bounds)
    ratio = torch.exp(log_ratio)
    # clip(r, l, u) = exp(clamp(log r, log l, log u)): no overflow at u = 1/p, log l = -inf is fine
    clipped_ratio = torch.exp(torch.clamp(log_ratio, log_lower, log_upper))
    pg_losses = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)
    if dual_clip is not None:
        dual_bound = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (pg_losses > dual_bound)
        pg_losses = torch.where(advantages < 0, torch.minimum(pg_losses, dual_bound), pg_losses)

    with torch.no_grad():
        log_ratio_d = log_ratio.detach()
        positive, negative = valid & (advantages > 0), valid & (advantages < 0)
        high = positive & (log_ratio_d > log_upper)
        low = negative & (log_ratio_d < log_lower)
        fixed_low, fixed_high = math.log(FIXED_CLIP[0]), math.log(FIXED_CLIP[1])
        high_fixed = positive & (log_ratio_d > fixed_high)
        low_fixed = negative & (log_ratio_d < fixed_low)
        ratio_d = ratio.detach()
        metrics = {
            "clipfrac_high": _masked_mean(high.to(dtype), weights),
            "clipfrac_low": _masked_mean(low.to(dtype), weights),
            "clipfrac": _masked_mean((high | low).to(dtype), weights),
            "approx_kl": _masked_mean(-log_ratio_d, weights),
            # k3 = (r - 1) - log r: unbiased, non-negative estimate of KL(pi_old || pi) (Schulman 2020)
            "approx_kl_k3": _masked_mean(torch.expm1(log_ratio_d) - log_ratio_d, weights),
            "band_width": _masked_mean(torch.exp(log_upper) - torch.exp(log_lower), weights),
            "clipfrac_high_fixed": _masked_mean(high_fixed.to(dtype), weights),
            "clipfrac_low_fixed": _masked_mean(low_fixed.to(dtype), weights),
            "clipfrac_fixed": _masked_mean((high_fixed | low_fixed).to(dtype), weights),
            "ratio_mean": _masked_mean(ratio_d, weights),
        }
        if dual_clip is not None:
            metrics["dual_clipfrac"] = _masked_mean(dual_clipped.to(dtype), weights)
    return pg_losses, metrics


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, loss_agg_mode: str = "token-mean", *, norm_length: int | None = None
) -> torch.Tensor:
    r"""Reduce a (B, T) per-token loss to a scalar; ``mask`` weights tokens (bool or float).

    With :math:`m_{bt}` the mask, :math:`\ell_{bt}` the loss, :math:`S = \{b : \sum_t m_{bt} > 0\}` the
    non-empty sequences (fully masked rows are padding and excluded, as in verl):

    - ``token-mean`` (DAPO, verl's default): :math:`\sum_{bt} m\ell / \sum_{bt} m`;
    - ``token-sum``: :math:`\sum_{bt} m\ell`;
    - ``seq-mean-token-mean`` (original GRPO, the BandPO runs): :math:`\frac1{|S|}\sum_{b\in S}
      \sum_t m\ell / \sum_t m`;
    - ``seq-mean-token-sum``: :math:`\frac1{|S|}\sum_{b\in S}\sum_t m\ell`;
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): :math:`\frac1{|S|\,L}\sum_{b\in S}\sum_t m\ell` with the constant
      :math:`L` = ``norm_length`` (default: the padded length T; pass the maximum generation length so
      the scale does not change with the batch).

    An empty mask gives 0.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")
    weights = mask.to(loss_mat.dtype)
    tiny = torch.finfo(loss_mat.dtype).tiny
    token_sums = (loss_mat * weights).sum(dim=-1)
    token_counts = weights.sum(dim=-1)
    if loss_agg_mode == "token-mean":
        return token_sums.sum() / token_counts.sum().clamp_min(tiny)
    if loss_agg_mode == "token-sum":
        return token_sums.sum()
    non_empty = (token_counts > 0).to(loss_mat.dtype)
    num_seqs = non_empty.sum().clamp_min(1.0)
    if loss_agg_mode == "seq-mean-token-mean":
        return (token_sums / token_counts.clamp_min(tiny) * non_empty).sum() / num_seqs
    loss = (token_sums * non_empty).sum() / num_seqs
    if loss_agg_mode == "seq-mean-token-sum-norm":
        length = loss_mat.shape[-1] if norm_length is None else norm_length
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"norm_length must be a positive integer, got {norm_length!r}")
        loss = loss / length
    return loss


def band_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    divergence: Any = "kl",
    delta: float = 0.05,
    loss_agg_mode: str = "token-mean",
    dual_clip: float | None = None,
    max_ratio: float | None = None,
    method: str = "band",
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    norm_length: int | None = None,
    log_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""PPO/GRPO clipped surrogate loss with the Band (or a fixed clip) as ratio bounds.

    .. math::

        \ell_{pg} = \max\bigl(-A\,r,\; -A\,\operatorname{clip}(r, l(p), u(p))\bigr),\quad
        r = e^{\log\pi - \log p},

    optionally :math:`\min(\ell_{pg}, -A c)` where :math:`A < 0` (dual clip), aggregated over the masked
    tokens by :func:`aggregate_loss`.  See the module docstring for the bounds of each ``method``.

    Parameters
    ----------
    log_prob
        (B, T) :math:`\log\pi` of the sampled tokens under the current policy (carries the gradient).
    old_log_prob
        (B, T) :math:`\log p` under the sampling policy (after temperature); no gradient flows into it.
    advantages
        (B,), (B, 1) or (B, T) advantages :math:`A`; no gradient.
    mask
        (B, T) bool or float; non-zero marks real tokens, float values weight them.  Masked positions may hold
        any value, NaN included: they never reach the loss, its gradient or the metrics.
    divergence, delta
        Band divergence (name, alias or :class:`bandcore.Divergence`) and radius :math:`\delta > 0`
        (``method="band"`` only).
    loss_agg_mode
        ``"token-mean"``, ``"token-sum"``, ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"`` or
        ``"seq-mean-token-sum-norm"`` (see :func:`aggregate_loss`; ``norm_length`` is its constant).
    dual_clip
        :math:`c > 1`: for :math:`A < 0` the loss is capped at :math:`-A c` (the BandPO runs used 10).
    max_ratio
        Cap on the upper bound :math:`u` (> 1); the BandPO runs used 10.
    method
        ``"band"``, ``"clip"`` (:math:`[1-\varepsilon, 1+\varepsilon]`) or ``"clip-higher"``
        (:math:`[1-\varepsilon, 1+\varepsilon_{high}]`, :math:`\varepsilon_{high}` = 0.28 by default).
    clip_eps, clip_eps_high
        :math:`\varepsilon` and :math:`\varepsilon_{high}` of the fixed clips.
    log_bounds
        Precomputed :math:`(\log l, \log u)`, (B, T), from :func:`log_ratio_bounds` of the same
        ``old_log_prob`` and settings.  The bounds depend only on ``old_log_prob``, so a trainer that takes
        several optimisation steps on one batch computes them once per batch instead of once per step.

    Returns
    -------
    loss
        0-dim tensor, with gradient with respect to ``log_prob``; computed in at least float32.
    metrics
        Detached 0-dim tensors (no host synchronisation here; call ``.item()`` when logging), masked means over
        the valid tokens: ``clipfrac_high`` (A > 0 and r > u), ``clipfrac_low`` (A < 0 and r < l),
        ``clipfrac`` (their union: the tokens whose gradient the clip zeroes), ``approx_kl``
        (mean of :math:`-\log r`), ``approx_kl_k3`` (mean of :math:`r - 1 - \log r`), ``band_width``
        (mean of :math:`u - l`; dominated by rare tokens, whose :math:`u` is large), ``ratio_mean``, the same
        three clip fractions for the fixed clip [0.8, 1.2] (``clipfrac_high_fixed``, ``clipfrac_low_fixed``,
        ``clipfrac_fixed``), and ``dual_clipfrac`` when ``dual_clip`` is set.

    Notes
    -----
    NaN policy: a NaN ``old_log_prob`` at a valid position gives NaN bounds, and the loss becomes NaN (it never
    silently turns into a bound); checking for it here would cost a host synchronisation per call.
    A valid position whose ``advantages`` or ``log_prob`` is NaN makes the loss NaN likewise.

    Examples
    --------
    >>> import torch
    >>> from bandcore.rl import band_policy_loss
    >>> old = torch.log(torch.tensor([[0.5, 0.08, 0.9]], dtype=torch.float64))
    >>> new = (old + torch.tensor([[0.5, 1.0, -0.5]], dtype=torch.float64)).requires_grad_()
    >>> loss, metrics = band_policy_loss(new, old, torch.tensor([1.0], dtype=torch.float64),
    ...                                  torch.ones(1, 3, dtype=torch.bool))
    >>> round(float(metrics["clipfrac_high"]), 4)   # p = 0.5 and 0.08 sit above u; p = 0.9 has A > 0, r < l
    0.6667
    """
    pg_losses, metrics = per_token_policy_loss(
        log_prob, old_log_prob, advantages, mask, divergence=divergence, delta=delta, dual_clip=dual_clip,
        max_ratio=max_ratio, method=method, clip_eps=clip_eps, clip_eps_high=clip_eps_high, log_bounds=log_bounds,
    )
    return aggregate_loss(pg_losses, mask, loss_agg_mode, norm_length=norm_length), metrics

r"""The Band policy loss: PPO's clipped surrogate with probability-aware (Band) ratio bounds.

For a sampled token with old log-probability :math:`\log p` (``old_log_prob``), new log-probability
:math:`\log \pi` (``log_prob``) and advantage :math:`A`:

.. math::

    \text{log\_ratio} = \log\pi - \log p, \qquad r = e^{\text{log\_ratio}}, \qquad
    \ell_{pg} = \max\bigl(-A\,r,\; -A\,\operatorname{clip}(r, l, u)\bigr),

and, with dual clip :math:`c > 1` (Ye et al. 2020), :math:`\ell_{pg} \leftarrow \min(\ell_{pg}, -A\,c)` where
:math:`A < 0`.  The bounds :math:`[l, u]` come from :func:`bandcore.rl.bounds.log_ratio_bounds` (the Band, or
a fixed clip) and carry no gradient.  The comparison is done in log space,
:math:`\operatorname{clip}(r, l, u) = \exp(\operatorname{clamp}(\text{log\_ratio}, \log l, \log u))`, so a
saturated lower bound (:math:`\log l = -\infty`) or a huge upper bound (:math:`u = 1/p`) never overflows.  The
ratio itself is not clamped (verl clamps the log-ratio to ±20; we do not change the gradient).

Input contract (checked at the boundary by :func:`check_policy_loss_inputs`; ``check=False`` skips the value
checks, which cost one host synchronisation): ``mask`` non-negative and not NaN; at unmasked tokens finite
advantages, :math:`\log p \le 10^{-6}` (:data:`bandcore._contract.LOG_P_TOLERANCE`; :math:`(0, 10^{-6}]` is read
as 0) and, for given ``log_bounds``, :math:`\log l \le \log u`, neither NaN.  Masked positions may hold anything.

Tokens the sampler could not have produced: :math:`\log p = -\infty` at an unmasked token makes
:math:`r = \pi/0` infinite, and no trust region is defined there.  Such a token is *dropped from the surrogate*:
its :math:`\ell_{pg}` is exactly 0 and so is its gradient (the dual clip does not apply), while it keeps its
weight in the aggregation's token counts (the mask is not changed).  It counts as clipped above in
``clipfrac_high`` / ``clipfrac`` and their fixed-clip twins, whatever the sign of :math:`A` (its gradient is
zeroed like that of a token above :math:`u`), and it is left out of the means of :math:`-\log r`,
:math:`r - 1 - \log r`, :math:`r` and :math:`u - l` (``approx_kl``, ``approx_kl_k3``, ``ratio_mean``,
``band_width``), which are over the tokens with a finite ratio.

Reference: BandPO (Band-constrained policy optimisation); PPO (Schulman et al. 2017); DAPO (Yu et al. 2025);
Dr. GRPO (Liu et al. 2025).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bandcore._contract import LOG_P_TOLERANCE

from .bounds import CLIP_HIGHER_EPS, FIXED_CLIP, METHODS, check_real, log_ratio_bounds

__all__ = ["CLIP_HIGHER_EPS", "FIXED_CLIP", "LOSS_AGG_MODES", "METHODS", "aggregate_loss", "band_policy_loss",
           "check_policy_loss_inputs", "log_ratio_bounds", "per_token_policy_loss"]

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum",
                  "seq-mean-token-sum-norm")


def _shape(x: torch.Tensor) -> tuple[int, ...]:
    return tuple(x.shape)


def _check_structure(log_prob, old_log_prob, advantages, mask, log_bounds) -> None:
    """Types, dtypes, shapes and devices (no host synchronisation)."""
    for name, value in (("log_prob", log_prob), ("old_log_prob", old_log_prob),
                        ("advantages", advantages), ("mask", mask)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    for name, value in (("log_prob", log_prob), ("old_log_prob", old_log_prob), ("advantages", advantages)):
        if not value.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if mask.is_complex():
        raise TypeError(f"mask must be a bool, integer or floating-point tensor, got dtype {mask.dtype}")
    if log_prob.ndim != 2:
        raise ValueError(f"log_prob must have shape (B, T), got shape {_shape(log_prob)}")
    shape = _shape(log_prob)
    for name, value in (("old_log_prob", old_log_prob), ("mask", mask)):
        if _shape(value) != shape:
            raise ValueError(f"{name} must have the shape of log_prob {shape}, got {_shape(value)}")
    if _shape(advantages) not in ((shape[0],), (shape[0], 1), shape):
        raise ValueError(
            f"advantages must have shape (B,), (B, 1) or (B, T) with (B, T) = {shape} the shape of log_prob, "
            f"got {_shape(advantages)}"
        )
    named = [("old_log_prob", old_log_prob), ("advantages", advantages), ("mask", mask)]
    if log_bounds is not None:
        if not (isinstance(log_bounds, (tuple, list)) and len(log_bounds) == 2
                and all(isinstance(b, torch.Tensor) for b in log_bounds)):
            raise TypeError(f"log_bounds must be a pair (log_lower, log_upper) of tensors, got {log_bounds!r:.80}")
        if any(_shape(b) != shape for b in log_bounds):
            raise ValueError(f"log_bounds must be two tensors of shape {shape} (the shape of log_prob), "
                             f"got {[_shape(b) for b in log_bounds]}")
        if not all(b.is_floating_point() for b in log_bounds):
            raise TypeError(f"log_bounds must be floating-point tensors, got {[b.dtype for b in log_bounds]}")
        named += [("log_bounds[0]", log_bounds[0]), ("log_bounds[1]", log_bounds[1])]
    for name, value in named:
        if value.device != log_prob.device:
            raise ValueError(f"{name} is on {value.device} but log_prob is on {log_prob.device}")


def check_policy_loss_inputs(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    log_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    values: bool = True,
) -> None:
    r"""Raise ``TypeError`` / ``ValueError`` naming the first input that breaks the loss's contract.

    Structure (always, no synchronisation): tensors, floating dtypes, ``log_prob`` (B, T), ``old_log_prob`` and
    ``mask`` (B, T), ``advantages`` (B,), (B, 1) or (B, T), ``log_bounds`` two (B, T) tensors, one device.
    Values (``values=True``; every test is a tensor reduction, all of them read back in one host
    synchronisation): ``mask`` :math:`\ge 0` and not NaN; at tokens with ``mask != 0``: ``advantages`` finite,
    ``old_log_prob`` :math:`\le 10^{-6}`, ``log_bounds`` not NaN with :math:`\log l \le \log u`.
    """
    _check_structure(log_prob, old_log_prob, advantages, mask, log_bounds)
    if not values or log_prob.numel() == 0:
        return
    with torch.no_grad():
        valid = mask != 0
        adv = advantages.detach()
        adv = adv[:, None] if adv.ndim == 1 else adv
        old = old_log_prob.detach()
        tests = {
            "mask_nan": torch.isnan(mask).any() if mask.is_floating_point() else None,
            "mask_negative": (mask < 0).any() if mask.dtype != torch.bool else None,
            "advantages": (valid & ~torch.isfinite(adv)).any(),
            "old_log_prob": (valid & (old > LOG_P_TOLERANCE)).any(),
        }
        if log_bounds is not None:
            lower, upper = (b.detach() for b in log_bounds)
            tests["bounds_nan"] = (valid & (torch.isnan(lower) | torch.isnan(upper))).any()
            tests["bounds_order"] = (valid & (lower > upper)).any()
        keys = [k for k, v in tests.items() if v is not None]
        flags = dict(zip(keys, torch.stack([tests[k] for k in keys]).tolist(), strict=True))  # one host sync
    if not any(flags.values()):
        return
    if flags.get("mask_nan"):
        raise ValueError(f"mask must not hold NaN, got {int(torch.isnan(mask).sum())} NaN value(s)")
    if flags.get("mask_negative"):
        negative = mask[mask < 0]
        raise ValueError(f"mask must be >= 0 (token weights), got {negative.numel()} negative value(s), "
                         f"e.g. mask={float(negative[0])!r}")
    if flags["advantages"]:
        bad = adv.expand_as(valid)[valid & ~torch.isfinite(adv)]
        raise ValueError(f"advantages must be finite at unmasked tokens, got {bad.numel()} non-finite value(s), "
                         f"e.g. advantages={float(bad[0])!r}")
    if flags["old_log_prob"]:
        bad = old[valid & (old > LOG_P_TOLERANCE)]
        raise ValueError(
            f"old_log_prob must be <= 0 at unmasked tokens (log-probabilities; up to {LOG_P_TOLERANCE:g} is read "
            f"as 0), got {bad.numel()} value(s) above, e.g. old_log_prob={float(bad[0])!r}"
        )
    if flags.get("bounds_nan"):
        raise ValueError("log_bounds must not be NaN at unmasked tokens, got NaN in "
                         f"{int((valid & (torch.isnan(lower) | torch.isnan(upper))).sum())} token(s)")
    if flags.get("bounds_order"):
        where = valid & (lower > upper)
        raise ValueError(f"log_bounds must have lower <= upper at unmasked tokens, got lower > upper in "
                         f"{int(where.sum())} token(s), e.g. ({float(lower[where][0])!r}, {float(upper[where][0])!r})")


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
    check: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""The per-token clipped surrogate :math:`\ell_{pg}` (B, T), zero at masked positions, and the metrics.

    Same arguments as :func:`band_policy_loss` (without aggregation); used by the verl plug-in, which
    weights and aggregates the matrix itself.
    """
    check_policy_loss_inputs(log_prob, old_log_prob, advantages, mask, log_bounds, values=check)
    if dual_clip is not None:
        dual_clip = check_real("dual_clip", dual_clip, above=1.0)
    # compute in at least fp32: bf16 ratios are too coarse for a clip test near 1
    dtype = torch.promote_types(torch.promote_types(log_prob.dtype, old_log_prob.dtype), torch.float32)
    valid = mask != 0
    weights = mask.to(dtype)
    old_log_prob = old_log_prob.detach().to(dtype)
    # log p = -inf: dropped from the surrogate (module docstring); its ratio is replaced by 1 before any arithmetic
    impossible = valid & (old_log_prob == -math.inf)
    live = valid & ~impossible
    # padding may hold anything (even NaN): replace it before any arithmetic so no NaN reaches a gradient
    old_for_bounds = torch.where(valid, old_log_prob, 0.0)
    # log p in (0, 1e-6] is read as 0; above it the bounds are NaN (check=False) and so is the loss
    old_log_prob = torch.where(live, old_log_prob.clamp(max=0.0), 0.0)
    advantages = advantages.detach().to(dtype)
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    advantages = torch.where(valid, advantages, 0.0)
    log_ratio = torch.where(live, log_prob.to(dtype) - old_log_prob, 0.0)

    if log_bounds is None:
        # the values were checked above (or deliberately not): no second synchronisation here
        log_bounds = log_ratio_bounds(old_for_bounds, method=method, divergence=divergence, delta=delta,
                                      max_ratio=max_ratio, clip_eps=clip_eps, clip_eps_high=clip_eps_high,
                                      check=False)
    # padding of precomputed bounds may hold anything: only real tokens' bounds are used
    log_lower, log_upper = (torch.where(live, b.detach().to(dtype), 0.0) for b in log_bounds)
    ratio = torch.exp(log_ratio)
    # clip(r, l, u) = exp(clamp(log r, log l, log u)): no overflow at u = 1/p, log l = -inf is fine
    clipped_ratio = torch.exp(torch.clamp(log_ratio, log_lower, log_upper))
    pg_losses = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)
    if dual_clip is not None:
        dual_bound = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (pg_losses > dual_bound) & live
        pg_losses = torch.where(advantages < 0, torch.minimum(pg_losses, dual_bound), pg_losses)
    pg_losses = torch.where(impossible, 0.0, pg_losses)

    with torch.no_grad():
        log_ratio_d = log_ratio.detach()
        live_weights = torch.where(impossible, 0.0, weights)
        positive, negative = live & (advantages > 0), live & (advantages < 0)
        high = positive & (log_ratio_d > log_upper) | impossible
        low = negative & (log_ratio_d < log_lower)
        fixed_low, fixed_high = math.log(FIXED_CLIP[0]), math.log(FIXED_CLIP[1])
        high_fixed = positive & (log_ratio_d > fixed_high) | impossible
        low_fixed = negative & (log_ratio_d < fixed_low)
        ratio_d = ratio.detach()
        metrics = {
            "clipfrac_high": _masked_mean(high.to(dtype), weights),
            "clipfrac_low": _masked_mean(low.to(dtype), weights),
            "clipfrac": _masked_mean((high | low).to(dtype), weights),
            "approx_kl": _masked_mean(-log_ratio_d, live_weights),
            # k3 = (r - 1) - log r: unbiased, non-negative estimate of KL(pi_old || pi) (Schulman 2020)
            "approx_kl_k3": _masked_mean(torch.expm1(log_ratio_d) - log_ratio_d, live_weights),
            "band_width": _masked_mean(torch.exp(log_upper) - torch.exp(log_lower), live_weights),
            "clipfrac_high_fixed": _masked_mean(high_fixed.to(dtype), weights),
            "clipfrac_low_fixed": _masked_mean(low_fixed.to(dtype), weights),
            "clipfrac_fixed": _masked_mean((high_fixed | low_fixed).to(dtype), weights),
            "ratio_mean": _masked_mean(ratio_d, live_weights),
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
    if _shape(mask) != _shape(loss_mat):
        raise ValueError(f"mask must have the shape of loss_mat {_shape(loss_mat)}, got {_shape(mask)}")
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
    check: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""PPO/GRPO clipped surrogate loss with the Band (or a fixed clip) as ratio bounds.

    .. math::

        \ell_{pg} = \max\bigl(-A\,r,\; -A\,\operatorname{clip}(r, l(p), u(p))\bigr),\quad
        r = e^{\log\pi - \log p},

    optionally :math:`\min(\ell_{pg}, -A c)` where :math:`A < 0` (dual clip), aggregated over the masked
    tokens by :func:`aggregate_loss`.  See :mod:`bandcore.rl.bounds` for the bounds of each ``method``.

    Parameters
    ----------
    log_prob
        (B, T) :math:`\log\pi` of the sampled tokens under the current policy (carries the gradient).
    old_log_prob
        (B, T) :math:`\log p \le 0` under the sampling policy (after temperature); no gradient flows into it.
        :math:`(0, 10^{-6}]` is read as 0.  :math:`-\infty` drops the token from the surrogate (see the module
        docstring: loss and gradient exactly 0 there).
    advantages
        (B,), (B, 1) or (B, T) advantages :math:`A`, finite at unmasked tokens; no gradient.
    mask
        (B, T) bool, integer or float, :math:`\ge 0`; non-zero marks real tokens, float values weight them.
        Masked positions may hold any value, NaN included: they never reach the loss, its gradient or the
        metrics.
    divergence, delta
        Band divergence (any spelling of :func:`bandcore.divergences.get_divergence`, or a
        :class:`bandcore.Divergence`) and radius :math:`\delta > 0` (``method="band"`` only).
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
    check
        Check the input values (:func:`check_policy_loss_inputs`: one host synchronisation per call) and raise
        ``ValueError`` naming the argument.  ``False`` skips them for speed; then a bad value gives NaN
        (:math:`\log p > 10^{-6}`, NaN mask or advantage) or an undefined loss instead of an error.  Types and
        shapes are always checked.

    Returns
    -------
    loss
        0-dim tensor, with gradient with respect to ``log_prob``; computed in at least float32.
    metrics
        Detached 0-dim tensors (call ``.item()`` when logging), masked means over the valid tokens:
        ``clipfrac_high`` (A > 0 and r > u), ``clipfrac_low`` (A < 0 and r < l), ``clipfrac`` (their union: the
        tokens whose gradient the clip zeroes), ``approx_kl`` (mean of :math:`-\log r`), ``approx_kl_k3``
        (mean of :math:`r - 1 - \log r`), ``band_width`` (mean of :math:`u - l`; dominated by rare tokens,
        whose :math:`u` is large), ``ratio_mean``, the same three clip fractions for the fixed clip [0.8, 1.2]
        (``clipfrac_high_fixed``, ``clipfrac_low_fixed``, ``clipfrac_fixed``), and ``dual_clipfrac`` when
        ``dual_clip`` is set.

    Notes
    -----
    NaN policy: a NaN ``old_log_prob`` or ``log_prob`` at a valid position makes the loss NaN (it never
    silently turns into a bound); the other invalid values raise (``check=True``).

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
        check=check,
    )
    return aggregate_loss(pg_losses, mask, loss_agg_mode, norm_length=norm_length), metrics

r"""The Band policy loss: PPO's clipped surrogate, or DPPO's masked truncated-IS objective, at the Band's bounds.

For a sampled token with old log-probability :math:`\log p` (``old_log_prob``), new log-probability
:math:`\log \pi` (``log_prob``), advantage :math:`A`, ratio :math:`r = e^{\log\pi - \log p}` and per-token
bounds :math:`[l, u]` (:func:`bandcore.rl.bounds.log_ratio_bounds`: the Band, or a fixed clip; no gradient):

- ``loss_form="clip"`` (PPO/GRPO/BandPO): :math:`\ell = \max\bigl(-A\,r,\; -A\,\operatorname{clip}(r, l,
  u)\bigr)`, and, with dual clip :math:`c > 1` (Ye et al. 2020), :math:`\ell \leftarrow \min(\ell, -A\,c)` where
  :math:`A < 0`;
- ``loss_form="dppo"`` (DPPO): :math:`\ell = -A\,\operatorname{sg}[\min(r, C)]\,\log\pi\cdot k` with the keep
  mask :math:`k = [A > 0 \wedge (r \le u \vee \pi \le p)] \vee [A \le 0 \wedge (r \ge l \vee \pi \ge p)]`: a
  token inside the trust region, or moving back toward it, keeps its truncated importance-sampling gradient
  :math:`-A \min(r, C)\,\nabla\log\pi`; the others are dropped.  :math:`C` = ``clip_ratio_c`` (default 20).
  With the Band of ``"kl"`` (:math:`KL(\pi_{old}\|\pi)`, whose :math:`g_f(p, r)` is DPPO's binary KL of
  :math:`(p, \pi)`) and of ``"tv"`` (:math:`g_f = |\pi - p|`) this is DPPO-Binary-KL and DPPO-Binary-TV, with
  :math:`\delta_{low}` / :math:`\delta_{high}` in the roles of their low and high thresholds.

**Anchor.**  ``anchor_log_prob`` (e.g. the rollout engine's log-probabilities) centres the trust region on
another policy :math:`\pi_a`: the bounds are the Band of :math:`p_a`, and they bound :math:`\pi/\pi_a`, so the
interval for :math:`r = \pi/p` is :math:`[l\,\pi_a/p,\ u\,\pi_a/p]`, and "moving back" means toward
:math:`\pi_a`.  Without it the anchor is the old policy.

The comparison is done in log space, :math:`\operatorname{clip}(r, l, u) = \exp(\operatorname{clamp}(\log r,
\log l, \log u))`, so a saturated lower bound (:math:`\log l = -\infty`) or a huge upper bound (:math:`u = 1/p`)
never overflows.  The ratio itself is not clamped (verl clamps the log-ratio to ±20; we do not change the
gradient).

Input contract (checked at the boundary by :func:`check_policy_loss_inputs`; ``check=False`` skips the value
checks, which cost one host synchronisation): ``mask`` non-negative and not NaN; at unmasked tokens finite
advantages, :math:`\log p \le 10^{-6}` (:data:`bandcore._contract.LOG_P_TOLERANCE`; :math:`(0, 10^{-6}]` is read
as 0), the same for ``anchor_log_prob`` and, for given ``log_bounds``, :math:`\log l \le \log u`, neither NaN.
Masked positions may hold anything.

Tokens the sampler could not have produced: :math:`\log p = -\infty` (or an anchor log-probability of
:math:`-\infty`) at an unmasked token makes the ratio infinite, and no trust region is defined there.  Such a
token is *dropped from the surrogate*: its loss is exactly 0 and so is its gradient, while it keeps its weight in
the aggregation's token counts (the mask is not changed).  It counts as clipped above in ``clipfrac_high`` /
``clipfrac`` and their fixed-clip twins, whatever the sign of :math:`A`, and it is left out of the means of
:math:`-\log r`, :math:`r - 1 - \log r`, :math:`r` and :math:`u - l` (``approx_kl``, ``approx_kl_k3``,
``ratio_mean``, ``band_width``), which are over the tokens with a finite ratio.

Reference: BandPO (Band-constrained policy optimisation); PPO (Schulman et al. 2017); DAPO (Yu et al. 2025);
Dr. GRPO (Liu et al. 2025); DPPO (Rethinking the Trust Region in LLM Reinforcement Learning, 2026).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .aggregate import LOSS_AGG_MODES, aggregate_loss
from .bounds import CLIP_HIGHER_EPS, FIXED_CLIP, METHODS, check_real, log_ratio_bounds
from .loss_inputs import check_policy_loss_inputs
from .settings import DEFAULT_CLIP_RATIO_C, LOSS_FORMS

__all__ = ["CLIP_HIGHER_EPS", "FIXED_CLIP", "LOSS_AGG_MODES", "LOSS_FORMS", "METHODS", "aggregate_loss",
           "band_policy_loss", "check_policy_loss_inputs", "log_ratio_bounds", "per_token_policy_loss"]


def _masked_mean(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    # an empty mask gives 0, not 0/0 = NaN
    return (values * weights).sum() / weights.sum().clamp_min(torch.finfo(weights.dtype).tiny)


def _check_form(loss_form: Any, dual_clip: Any, clip_ratio_c: Any) -> tuple[float | None, float]:
    """``(dual_clip, C)`` checked against ``loss_form``; ValueError naming the argument."""
    if loss_form not in LOSS_FORMS:
        raise ValueError(f"loss_form must be one of {LOSS_FORMS}, got {loss_form!r}")
    if dual_clip is not None:
        dual_clip = check_real("dual_clip", dual_clip, above=1.0)
        if loss_form == "dppo":
            raise ValueError(f"dual_clip={dual_clip!r} applies to loss_form='clip'; the dppo form truncates the "
                             "ratio at clip_ratio_c instead")
    if clip_ratio_c is None:
        return dual_clip, DEFAULT_CLIP_RATIO_C
    truncation = check_real("clip_ratio_c", clip_ratio_c, above=1.0)
    if loss_form != "dppo":
        raise ValueError(f"clip_ratio_c={truncation!r} is the truncation of loss_form='dppo', got "
                         f"loss_form={loss_form!r}")
    return dual_clip, truncation


def per_token_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    divergence: Any = "kl",
    delta: float | None = None,
    dual_clip: float | None = None,
    max_ratio: float | None = None,
    method: str = "band",
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    log_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    check: bool = True,
    delta_low: float | None = None,
    delta_high: float | None = None,
    loss_form: str = "clip",
    clip_ratio_c: float | None = None,
    anchor_log_prob: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""The per-token loss :math:`\ell` (B, T), zero at masked positions, and the metrics.

    Same arguments as :func:`band_policy_loss` (without aggregation); used by the verl plug-in, which
    weights and aggregates the matrix itself.
    """
    check_policy_loss_inputs(log_prob, old_log_prob, advantages, mask, log_bounds, values=check,
                             anchor_log_prob=anchor_log_prob)
    dual_clip, truncation = _check_form(loss_form, dual_clip, clip_ratio_c)
    # compute in at least fp32: bf16 ratios are too coarse for a clip test near 1
    dtype = torch.promote_types(torch.promote_types(log_prob.dtype, old_log_prob.dtype), torch.float32)
    valid = mask != 0
    weights = mask.to(dtype)
    old_log_prob = old_log_prob.detach().to(dtype)
    anchor = old_log_prob if anchor_log_prob is None else anchor_log_prob.detach().to(dtype)
    # log p = -inf: dropped from the surrogate (module docstring); its ratio is replaced by 1 before any arithmetic
    impossible = valid & ((old_log_prob == -math.inf) | (anchor == -math.inf))
    live = valid & ~impossible
    # padding may hold anything (even NaN): replace it before any arithmetic so no NaN reaches a gradient
    anchor_for_bounds = torch.where(valid, anchor, 0.0)
    # log p in (0, 1e-6] is read as 0; above it the bounds are NaN (check=False) and so is the loss
    old_log_prob = torch.where(live, old_log_prob.clamp(max=0.0), 0.0)
    advantages = advantages.detach().to(dtype)
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    advantages = torch.where(valid, advantages, 0.0)
    new_log_prob = torch.where(live, log_prob.to(dtype), 0.0)
    log_ratio = new_log_prob - old_log_prob

    if log_bounds is None:
        # the values were checked above (or deliberately not): no second synchronisation here
        log_bounds = log_ratio_bounds(anchor_for_bounds, method=method, divergence=divergence, delta=delta,
                                      delta_low=delta_low, delta_high=delta_high, max_ratio=max_ratio,
                                      clip_eps=clip_eps, clip_eps_high=clip_eps_high, check=False)
    # padding of precomputed bounds may hold anything: only real tokens' bounds are used
    log_lower, log_upper = (torch.where(live, b.detach().to(dtype), 0.0) for b in log_bounds)
    if anchor_log_prob is None:
        shift = torch.zeros_like(log_ratio)
        ratio_lower, ratio_upper = log_lower, log_upper
    else:  # bounds of pi / pi_anchor, as bounds of r = pi / pi_old
        shift = torch.where(live, anchor.clamp(max=0.0), 0.0) - old_log_prob
        ratio_lower, ratio_upper = log_lower + shift, log_upper + shift
    ratio = torch.exp(log_ratio)
    log_ratio_d = log_ratio.detach()
    positive, negative = live & (advantages > 0), live & (advantages < 0)
    extra: dict[str, torch.Tensor] = {}
    if loss_form == "clip":
        # clip(r, l, u) = exp(clamp(log r, log l, log u)): no overflow at u = 1/p, log l = -inf is fine
        clipped_ratio = torch.exp(torch.clamp(log_ratio, ratio_lower, ratio_upper))
        pg_losses = torch.maximum(-advantages * ratio, -advantages * clipped_ratio)
        if dual_clip is not None:
            dual_bound = -advantages * dual_clip
            extra["dual_clipfrac"] = (advantages < 0) & (pg_losses > dual_bound) & live
            pg_losses = torch.where(advantages < 0, torch.minimum(pg_losses, dual_bound), pg_losses)
        high = positive & (log_ratio_d > ratio_upper)
        low = negative & (log_ratio_d < ratio_lower)
    else:
        # inside the trust region, or moving back toward the anchor (pi <= pi_a for A > 0, pi >= pi_a for A <= 0)
        keep_up = log_ratio_d <= torch.maximum(ratio_upper, shift)
        keep_down = log_ratio_d >= torch.minimum(ratio_lower, shift)
        keep = torch.where(advantages > 0, keep_up, keep_down)
        truncated = torch.clamp(ratio.detach(), max=truncation)
        pg_losses = -advantages * truncated * new_log_prob * keep.to(dtype)
        extra["truncfrac"] = live & keep & (ratio.detach() > truncation)
        high, low = positive & ~keep_up, negative & ~keep_down
    pg_losses = torch.where(impossible, 0.0, pg_losses)

    with torch.no_grad():
        live_weights = torch.where(impossible, 0.0, weights)
        high = high | impossible
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
        metrics.update({name: _masked_mean(flags.to(dtype), weights) for name, flags in extra.items()})
    return pg_losses, metrics


def band_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    divergence: Any = "kl",
    delta: float | None = None,
    loss_agg_mode: str = "token-mean",
    dual_clip: float | None = None,
    max_ratio: float | None = None,
    method: str = "band",
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    norm_length: int | None = None,
    log_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    check: bool = True,
    delta_low: float | None = None,
    delta_high: float | None = None,
    loss_form: str = "clip",
    clip_ratio_c: float | None = None,
    anchor_log_prob: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    r"""The policy loss with the Band (or a fixed clip) as trust region, aggregated over the masked tokens.

    ``loss_form="clip"``: :math:`\max(-A\,r, -A\,\operatorname{clip}(r, l(p), u(p)))`, optionally
    :math:`\min(\cdot, -A c)` where :math:`A < 0` (dual clip); ``loss_form="dppo"``: :math:`-A\,\min(r, C)\,
    \log\pi` over the tokens inside the trust region or moving back toward it (see the module docstring).
    Aggregated by :func:`aggregate_loss`; the bounds of each ``method``: :mod:`bandcore.rl.bounds`.

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
    divergence
        Band divergence (any spelling of :func:`bandcore.divergences.resolve_region`, or a
        :class:`bandcore.Divergence`; ``method="band"`` only).
    delta, delta_low, delta_high
        Radii :math:`\delta > 0` (``method="band"`` only): ``delta`` sets both sides (default 0.05);
        ``delta_low`` gives the lower bound :math:`l = r_{lo}(p, \delta_{low})`, ``delta_high`` the upper
        :math:`u = r_{up}(p, \delta_{high})`; a side not given takes ``delta``.  ``delta`` together with a side
        of another value raises ``ValueError``.
    loss_agg_mode
        ``"token-mean"``, ``"token-sum"``, ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"`` or
        ``"seq-mean-token-sum-norm"`` (see :func:`aggregate_loss`; ``norm_length`` is its constant).
    dual_clip
        :math:`c > 1`: for :math:`A < 0` the loss is capped at :math:`-A c` (the BandPO runs used 10); clip
        form only.
    max_ratio
        Cap on the upper bound :math:`u` (> 1); the BandPO runs used 10.
    method
        ``"band"``, ``"clip"`` (:math:`[1-\varepsilon, 1+\varepsilon]`) or ``"clip-higher"``
        (:math:`[1-\varepsilon, 1+\varepsilon_{high}]`, :math:`\varepsilon_{high}` = 0.28 by default).
    clip_eps, clip_eps_high
        :math:`\varepsilon` and :math:`\varepsilon_{high}` of the fixed clips.
    log_bounds
        Precomputed :math:`(\log l, \log u)`, (B, T), from :func:`log_ratio_bounds` of the same settings at
        ``old_log_prob`` (or at ``anchor_log_prob`` when given).  The bounds depend only on those, so a trainer
        that takes several optimisation steps on one batch computes them once per batch instead of once per step.
    check
        Check the input values (:func:`check_policy_loss_inputs`: one host synchronisation per call) and raise
        ``ValueError`` naming the argument.  ``False`` skips them for speed; then a bad value gives NaN
        (:math:`\log p > 10^{-6}`, NaN mask or advantage) or an undefined loss instead of an error.  Types and
        shapes are always checked.
    loss_form
        ``"clip"`` or ``"dppo"`` (module docstring).
    clip_ratio_c
        :math:`C > 1`, the truncation :math:`\min(r, C)` of the dppo form (default 20); dppo form only.
    anchor_log_prob
        Optional (B, T) log-probabilities of the policy the trust region is centred on (e.g. the rollout
        engine's); default: ``old_log_prob``.

    Returns
    -------
    loss
        0-dim tensor, with gradient with respect to ``log_prob``; computed in at least float32.
    metrics
        Detached 0-dim tensors (call ``.item()`` when logging), masked means over the valid tokens:
        ``clipfrac_high`` (A > 0 and above the trust region: clipped, or dropped by the dppo form),
        ``clipfrac_low`` (A < 0 and below it), ``clipfrac`` (their union: the tokens whose gradient the trust
        region zeroes), ``approx_kl`` (mean of :math:`-\log r`), ``approx_kl_k3`` (mean of :math:`r - 1 - \log
        r`), ``band_width`` (mean of :math:`u - l`; dominated by rare tokens, whose :math:`u` is large),
        ``ratio_mean``, the same three clip fractions for the fixed clip [0.8, 1.2] (``clipfrac_high_fixed``,
        ``clipfrac_low_fixed``, ``clipfrac_fixed``), ``dual_clipfrac`` when ``dual_clip`` is set, and, for the
        dppo form, ``truncfrac`` (kept tokens with :math:`r > C`).

    Notes
    -----
    NaN policy: a NaN ``old_log_prob``, ``anchor_log_prob`` or ``log_prob`` at a valid position makes the loss NaN
    (it never silently turns into a bound); the other invalid values raise (``check=True``).

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
        check=check, delta_low=delta_low, delta_high=delta_high, loss_form=loss_form, clip_ratio_c=clip_ratio_c,
        anchor_log_prob=anchor_log_prob,
    )
    return aggregate_loss(pg_losses, mask, loss_agg_mode, norm_length=norm_length), metrics

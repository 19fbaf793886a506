r"""BandPO in TRL: a :class:`trl.GRPOTrainer` whose ratio clip is the Band.

Switching a TRL GRPO run to BandPO is one line each::

    from bandcore.rl.trl import BandGRPOConfig, BandGRPOTrainer
    args = BandGRPOConfig(..., num_iterations=2, band_divergence="kl", band_delta=0.05)
    trainer = BandGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, ...)

How it works (TRL 1.16, ``trl/trainer/grpo_trainer.py``): TRL's token-level surrogate is
:math:`-\min(r A, \operatorname{clamp}(r, 1-\varepsilon_{low}, 1+\varepsilon_{high}) A)` with the plain
attributes ``self.epsilon_low`` / ``self.epsilon_high``, and its clip metrics compare :math:`r` with the same
attributes.  Both broadcast, so for the duration of one ``_compute_loss`` call we set them to per-token tensors

.. math::  \varepsilon_{low} = 1 - l(p), \qquad \varepsilon_{high} = u(p) - 1, \qquad
           p = \exp(\texttt{old\_per\_token\_logps}),

and TRL computes the Band loss and the Band's ``clip_ratio/*`` metrics with its own code (no copy of it here);
afterwards the scalar values are restored.  :math:`[l, u]` come from :func:`bandcore.rl.bounds.log_ratio_bounds`
(:math:`1 - (1 - l)` rounds :math:`l` to the dtype's absolute precision, about 1e-16 in fp64 and 6e-8 in
fp32).  TRL's ``epsilon`` / ``epsilon_high`` no longer clip; they define the fixed clip that the extra
metrics ``band/clip_ratio_fixed/{low,high,region}_mean`` report for comparison, beside ``band/width_mean``
(mean :math:`u - l` over completion tokens).  TRL's ``delta`` (two-sided clipping) still applies on top.

Supported: ``importance_sampling_level="token"`` and ``loss_type`` in grpo, bnpo, dr_grpo, dapo.  Refused with
a ``ValueError`` naming the setting: sequence-level importance sampling (one ratio per sequence has no
per-token :math:`p`), other loss types (cispo, sapo, vespo, luspo do not use the two-sided clamp), and
``use_liger_kernel`` (not tested with the Band; Liger's fused GRPO loss clips inside its own kernel).

The ratio moves only when a batch is optimised after an optimizer step that followed its generation.  TRL
(``_generate_and_score_completions``) computes ``old_per_token_logps`` only when ``gradient_accumulation_steps``
is not a multiple of ``steps_per_generation * num_iterations``; otherwise every pass over a batch happens within
the optimizer step that generated it, the ratio is exactly 1 and no bound can act.  :class:`BandGRPOConfig`
therefore defaults to ``num_iterations=2`` and refuses (``ValueError`` naming the three fields) a configuration
where the ratio is always 1, unless ``band_allow_on_policy=True`` says that it is intended; a batch that still
arrives without ``old_per_token_logps`` is run through TRL's loss unchanged (with one ``UserWarning`` unless
``band_allow_on_policy`` is set).

Metrics added to TRL's (``self._metrics[mode]``, reduced over processes with one host synchronisation per
step): ``band/clip_ratio/{low,high,region}`` (fractions of completion tokens the Band clips, equal to TRL's
``clip_ratio/*_mean`` under the Band), ``band/width_mean``, ``band/clip_ratio_fixed/{low,high,region}_mean``
and, per bucket of the old probability :math:`p`, the Band's clipped fraction of the tokens in that bucket:
``band/clip_ratio/p<0.01``, ``band/clip_ratio/p0.01-0.1``, ``band/clip_ratio/p0.1-0.5``,
``band/clip_ratio/p>=0.5`` (a bucket holding no token in a step, over all processes, logs nothing that step).

TRL versions: :data:`SUPPORTED_TRL`; CI runs the TRL tests at both ends (TRL 1.16 with the newest transformers,
and TRL 1.14.0 with transformers 4.56.2, the lowest it accepts).  The trainer overrides exactly two private
methods, ``GRPOTrainer._compute_loss`` and ``_get_per_token_logps_and_entropies`` (tests guard their signatures
and the lines of TRL's loss this relies on); importing this module with a TRL outside ``SUPPORTED_TRL`` raises
``ImportError``.
"""

from __future__ import annotations

import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import trl
from packaging.version import InvalidVersion, Version

#: TRL versions this adapter supports, as a pip requirement (the ``rl`` extra pins the same range).
SUPPORTED_TRL = "trl>=1.14,<1.17"
_TRL_RANGE = ((1, 14), (1, 17))


def _check_trl_version(version: str) -> None:
    """Raise ``ImportError`` when TRL ``version`` is outside :data:`SUPPORTED_TRL` (pre-releases of 1.17 too)."""
    try:
        release = Version(version).release
    except InvalidVersion:
        release = None
    if release is None or not _TRL_RANGE[0] <= release < _TRL_RANGE[1]:
        raise ImportError(
            f"bandcore.rl.trl supports {SUPPORTED_TRL} (it overrides private GRPOTrainer methods), but trl "
            f"{version} is installed; install a supported version, e.g. pip install '{SUPPORTED_TRL}'"
        )


_check_trl_version(trl.__version__)

from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from .bounds import check_bound_settings, log_ratio_bounds  # noqa: E402

__all__ = ["P_BUCKETS", "SUPPORTED_LOSS_TYPES", "SUPPORTED_TRL", "BandGRPOConfig", "BandGRPOTrainer"]

#: TRL loss types whose surrogate is the two-sided clamp that the Band replaces.
SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
#: Old-probability buckets of the ``band/clip_ratio/<bucket>`` metrics: (name, lower edge, upper edge), p in [lo, hi).
P_BUCKETS = (("p<0.01", 0.0, 0.01), ("p0.01-0.1", 0.01, 0.1), ("p0.1-0.5", 0.1, 0.5), ("p>=0.5", 0.5, math.inf))

_ON_POLICY_WARNING = (
    "BandGRPOTrainer: this batch has no old_per_token_logps (fully on-policy training: num_iterations == 1 and "
    "generation aligned with gradient accumulation), so the ratio is exactly 1 and the Band never clips. Set "
    "num_iterations >= 2 (or steps_per_generation > gradient_accumulation_steps) for the Band to act."
)


def ratio_is_always_one(args: GRPOConfig) -> bool:
    """True when TRL never computes ``old_per_token_logps`` for a fresh batch, so that its ratio is exactly 1.

    TRL's rule (``_generate_and_score_completions``): generation happens every ``steps_per_generation *
    num_iterations`` micro-steps, and when that divides ``gradient_accumulation_steps`` every pass over a batch
    lies within the optimizer step that generated it (with vLLM TRL computes the old log-probabilities anyway,
    but with the same weights, so the ratio is 1 there too).
    """
    generate_every = args.steps_per_generation * args.num_iterations
    return args.gradient_accumulation_steps % generate_every == 0


def _check_band_settings(args: GRPOConfig) -> None:
    """Raise ``ValueError`` naming the first setting the Band route does not support."""
    if args.importance_sampling_level != "token":
        raise ValueError(
            "importance_sampling_level must be 'token' for BandGRPOTrainer (the Band bounds each token's ratio "
            f"by that token's old probability), got {args.importance_sampling_level!r}"
        )
    if args.loss_type not in SUPPORTED_LOSS_TYPES:
        raise ValueError(
            f"loss_type must be one of {SUPPORTED_LOSS_TYPES} for BandGRPOTrainer (losses without the two-sided "
            f"ratio clamp cannot take the Band), got {args.loss_type!r}"
        )
    if args.use_liger_kernel:
        raise ValueError(
            "use_liger_kernel=True is not supported by BandGRPOTrainer (Liger's fused GRPO loss computes its own "
            "clip, out of the Band's reach), got use_liger_kernel=True"
        )
    if ratio_is_always_one(args) and not args.band_allow_on_policy:
        raise ValueError(
            "the ratio is always 1 with num_iterations="
            f"{args.num_iterations}, steps_per_generation={args.steps_per_generation}, gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps} (gradient_accumulation_steps is a multiple of steps_per_generation "
            "* num_iterations, so every batch is used within the optimizer step that generated it) and the Band "
            "never acts; make gradient_accumulation_steps not a multiple of steps_per_generation * num_iterations "
            "(e.g. num_iterations=2 with steps_per_generation = gradient_accumulation_steps, the default), or set "
            "band_allow_on_policy=True if on-policy training is intended"
        )


@dataclass
class BandGRPOConfig(GRPOConfig):
    r"""A :class:`trl.GRPOConfig` with the Band's hyperparameters.

    Parameters
    ----------
    band_divergence
        f-divergence of the trust region: any spelling of :func:`bandcore.divergences.get_divergence` (a
        catalogue name or alias, ``alpha(a)``, a formula in ``u``); ``"kl"`` is :math:`KL(\pi_{old}\|\pi)`,
        BandPO's choice.
    band_delta
        Trust-region radius :math:`\delta > 0` (BandPO: 0.05).
    band_max_ratio
        Optional cap on the upper bound :math:`u \le` ``band_max_ratio`` (> 1); the BandPO runs used 10.
    band_allow_on_policy
        Accept a configuration where the ratio is always 1 (see ``num_iterations``); default ``False``: such a
        configuration raises ``ValueError``.
    num_iterations
        Defaults to 2 here (TRL: 1): each generated batch is optimised twice, so from the second pass on the
        ratio differs from 1 and the Band acts.  With TRL's ``num_iterations=1`` and ``steps_per_generation``
        equal to ``gradient_accumulation_steps`` (TRL's default), or in general whenever
        ``gradient_accumulation_steps`` is a multiple of ``steps_per_generation * num_iterations``, the ratio is
        exactly 1 and the configuration is refused unless ``band_allow_on_policy=True``.

    ``epsilon`` / ``epsilon_high`` do not clip under the Band; they define the fixed clip reported beside it
    in the ``band/clip_ratio_fixed/*`` metrics.  See :mod:`bandcore.rl.trl` for the supported settings.
    """

    band_divergence: str = field(
        default="kl",
        metadata={"help": "f-divergence of the Band's trust region (name, alias, alpha(a) or a formula in u)."},
    )
    band_delta: float = field(default=0.05, metadata={"help": "Radius δ > 0 of the Band's trust region."})
    band_max_ratio: float | None = field(
        default=None, metadata={"help": "Optional cap (> 1) on the Band's upper ratio bound."}
    )
    band_allow_on_policy: bool = field(
        default=False,
        metadata={"help": "Accept a configuration where the ratio is always 1 (the Band then never acts)."},
    )
    num_iterations: int = field(
        default=2,
        metadata={"help": "Optimisation passes per generated batch (μ); 2 by default so that the Band acts."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.band_divergence, str):
            raise TypeError(
                f"band_divergence must be a divergence name or alias (str), got {self.band_divergence!r}"
            )
        # the loss's own checks and messages; the divergence by bandcore.divergences.get_divergence
        check_bound_settings(divergence=self.band_divergence, delta=self.band_delta, max_ratio=self.band_max_ratio)
        _check_band_settings(self)


class BandGRPOTrainer(GRPOTrainer):
    """:class:`trl.GRPOTrainer` with the Band as its ratio clip; takes the arguments of ``GRPOTrainer``.

    ``args`` must be a :class:`BandGRPOConfig`.  The loss, its aggregation (``loss_type``), the KL penalty,
    entropy bonus and TRL's metrics are TRL's own; only the clip bounds change, per token.
    """

    def __init__(self, *pargs: Any, **kwargs: Any) -> None:
        args = kwargs.get("args", pargs[2] if len(pargs) > 2 else None)
        if not isinstance(args, BandGRPOConfig):
            raise TypeError(f"args must be a BandGRPOConfig, got {type(args).__name__}")
        _check_band_settings(args)  # fields may have been changed after the config was built
        super().__init__(*pargs, **kwargs)
        self._band_capture_logps = False
        self._band_logps: torch.Tensor | None = None
        self._band_warned_on_policy = False

    def _get_per_token_logps_and_entropies(self, *pargs: Any, **kwargs: Any):
        out = super()._get_per_token_logps_and_entropies(*pargs, **kwargs)
        if self._band_capture_logps:  # only the call made by _compute_loss: the current policy's log π
            self._band_logps = out[0].detach()
        return out

    @contextmanager
    def _band_epsilons(self, epsilon_low: torch.Tensor, epsilon_high: torch.Tensor):
        saved = (self.epsilon_low, self.epsilon_high)
        self.epsilon_low, self.epsilon_high = epsilon_low, epsilon_high
        self._band_capture_logps = True
        try:
            yield
        finally:
            self.epsilon_low, self.epsilon_high = saved
            self._band_capture_logps = False

    def band_ratio_bounds(self, old_log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Band's ratio bounds ``(l, u)`` for old log-probabilities, with this trainer's Band settings."""
        args = self.args
        log_lower, log_upper = log_ratio_bounds(
            old_log_prob, divergence=args.band_divergence, delta=args.band_delta, max_ratio=args.band_max_ratio
        )
        return torch.exp(log_lower), torch.exp(log_upper)

    def _compute_loss(self, model, inputs):
        old_log_prob = inputs.get("old_per_token_logps")
        if old_log_prob is None:
            if not (self._band_warned_on_policy or self.args.band_allow_on_policy):
                self._band_warned_on_policy = True
                warnings.warn(_ON_POLICY_WARNING, UserWarning, stacklevel=2)
            return super()._compute_loss(model, inputs)
        lower, upper = self.band_ratio_bounds(old_log_prob)
        epsilon_low, epsilon_high = 1.0 - lower, upper - 1.0
        with self._band_epsilons(epsilon_low, epsilon_high):
            loss = super()._compute_loss(model, inputs)
            log_prob = self._band_logps
        self._band_logps = None
        self._log_band_metrics(inputs, log_prob, old_log_prob, lower, upper, epsilon_low, epsilon_high)
        return loss

    def _log_band_metrics(self, inputs, log_prob, old_log_prob, lower, upper, epsilon_low, epsilon_high) -> None:
        """The Band's clip fractions (overall and per old-probability bucket), its width and the fixed clip's
        fractions, reduced over processes in one call (one host synchronisation)."""
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mask = mask.to(lower.dtype)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        ratio = torch.exp(log_prob - old_log_prob)
        # the Band's clips, as TRL's clip metrics compare them (same expressions, same rounding)
        band_low = (ratio < 1 - epsilon_low) & (advantages < 0)
        band_high = (ratio > 1 + epsilon_high) & (advantages > 0)
        band_region = band_low | band_high
        low = (ratio < 1 - self.epsilon_low) & (advantages < 0)
        high = (ratio > 1 + self.epsilon_high) & (advantages > 0)
        old_prob = torch.exp(old_log_prob)
        sums = [(upper - lower) * mask, band_low * mask, band_high * mask, band_region * mask,
                low * mask, high * mask, (low | high) * mask]
        for _, lo, hi in P_BUCKETS:
            in_bucket = mask * ((old_prob >= lo) & (old_prob < hi))
            sums += [band_region * in_bucket, in_bucket]
        sums.append(mask)
        totals = self.accelerator.reduce(torch.stack([x.sum() for x in sums]), reduction="sum").tolist()
        count = max(totals[-1], 1.0)
        mode = "train" if self.model.training else "eval"
        names = ("band/width_mean", "band/clip_ratio/low", "band/clip_ratio/high", "band/clip_ratio/region",
                 "band/clip_ratio_fixed/low_mean", "band/clip_ratio_fixed/high_mean",
                 "band/clip_ratio_fixed/region_mean")
        for name, total in zip(names, totals, strict=False):
            self._metrics[mode][name].append(total / count)
        buckets = totals[len(names):-1]
        for (name, _, _), clipped, tokens in zip(P_BUCKETS, buckets[0::2], buckets[1::2], strict=True):
            if tokens > 0:  # an empty bucket logs nothing (TRL averages each key's list over the logging window)
                self._metrics[mode][f"band/clip_ratio/{name}"].append(clipped / tokens)

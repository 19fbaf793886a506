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

When a batch has no ``old_per_token_logps`` (TRL skips them when training is fully on-policy:
``num_iterations == 1`` and generation aligned with gradient accumulation, without vLLM) the ratio is exactly
1, no bound can act and the Band changes nothing: the trainer then warns once (``UserWarning``) and runs TRL's
loss unchanged.  Use ``num_iterations >= 2`` (or ``steps_per_generation > gradient_accumulation_steps``).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from trl import GRPOConfig, GRPOTrainer

from .bounds import check_bound_settings, log_ratio_bounds

__all__ = ["SUPPORTED_LOSS_TYPES", "BandGRPOConfig", "BandGRPOTrainer"]

#: TRL loss types whose surrogate is the two-sided clamp that the Band replaces.
SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")

_ON_POLICY_WARNING = (
    "BandGRPOTrainer: this batch has no old_per_token_logps (fully on-policy training: num_iterations == 1 and "
    "generation aligned with gradient accumulation), so the ratio is exactly 1 and the Band never clips. Set "
    "num_iterations >= 2 (or steps_per_generation > gradient_accumulation_steps) for the Band to act."
)


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

    def _compute_loss(self, model, inputs):
        old_log_prob = inputs.get("old_per_token_logps")
        if old_log_prob is None:
            if not self._band_warned_on_policy:
                self._band_warned_on_policy = True
                warnings.warn(_ON_POLICY_WARNING, UserWarning, stacklevel=2)
            return super()._compute_loss(model, inputs)
        args = self.args
        log_lower, log_upper = log_ratio_bounds(
            old_log_prob, divergence=args.band_divergence, delta=args.band_delta, max_ratio=args.band_max_ratio
        )
        lower, upper = torch.exp(log_lower), torch.exp(log_upper)
        with self._band_epsilons(1.0 - lower, upper - 1.0):
            loss = super()._compute_loss(model, inputs)
            log_prob = self._band_logps
        self._band_logps = None
        self._log_band_metrics(inputs, log_prob, old_log_prob, lower, upper)
        return loss

    def _log_band_metrics(self, inputs, log_prob, old_log_prob, lower, upper) -> None:
        """Band width and the fixed clip's fractions, reduced over processes like TRL's clip metrics."""
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        mask = mask.to(lower.dtype)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        ratio = torch.exp(log_prob - old_log_prob)
        low = (ratio < 1 - self.epsilon_low) & (advantages < 0)
        high = (ratio > 1 + self.epsilon_high) & (advantages > 0)
        sums = torch.stack([
            ((upper - lower) * mask).sum(),
            (low * mask).sum(),
            (high * mask).sum(),
            ((low | high) * mask).sum(),
            mask.sum(),
        ])
        totals = self.accelerator.reduce(sums, reduction="sum").tolist()  # one host sync
        count = max(totals[-1], 1.0)
        mode = "train" if self.model.training else "eval"
        names = ("band/width_mean", "band/clip_ratio_fixed/low_mean", "band/clip_ratio_fixed/high_mean",
                 "band/clip_ratio_fixed/region_mean")
        for name, total in zip(names, totals[:-1], strict=True):
            self._metrics[mode][name].append(total / count)

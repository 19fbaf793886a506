r"""OpenRLHF plug-in: :class:`BandPolicyLoss`, OpenRLHF's PPO policy loss with the Band as its clip.

:class:`BandPolicyLoss` is a drop-in subclass of OpenRLHF's ``PolicyLoss`` (``openrlhf/models/loss.py``, tested
with OpenRLHF 0.11.2): the same constructor arguments, plus the Band's settings as ``band_<field>`` keywords (the
fields of :class:`bandcore.rl.settings.BandSettings`: ``band_divergence``, ``band_delta``, ``band_delta_low`` /
``band_delta_high``, ``band_max_ratio``, ``band_method``, ``band_loss_form``, ``band_clip_ratio_c``, the schedule
``band_delta_schedule`` / ``band_delta_end`` / ``band_delta_steps`` / ``band_delta_hold_steps``, the controller
``band_target_kl`` / ``band_kl_rate`` / ``band_delta_min`` / ``band_delta_max``, ``band_anchor``, ``band_check``),
and ``band_gate`` (below).  The same call, the same return tuple ``(loss, clip_ratio, ppo_kl, vllm_kl,
is_filter_ratio)``, which OpenRLHF's actor logs as ``policy_loss``, ``ppo_clip_ratio``, ``ppo_kl``, ``vllm_kl``
and ``is_filter_ratio``.  To switch a ``train_ppo_ray`` run in every Ray worker, see
:mod:`bandcore.rl.openrlhf_launch`.

**How.**  OpenRLHF clips with ``ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high)``, which broadcasts tensors.
For the duration of one call, ``clip_eps_low`` / ``clip_eps_high`` become the per-token tensors
:math:`1 - l` and :math:`u - 1`, where :math:`[l, u]` is the Band of each token's old probability (from the
bounds provider of :class:`BandSettings`: the exact solver, or the shipped 2-D table when δ moves), and OpenRLHF's
own code computes the loss, its dual clip, its train/rollout mismatch correction, its aggregation and its
metrics; afterwards the scalars are restored.  ``clip_ratio`` is then the Band's clip fraction.  (OpenRLHF's
``1 - (1 - l)`` rounds :math:`l` to the dtype's absolute precision: about 1e-16 in fp64, 6e-8 in fp32.)

- ``band_method="clip"`` / ``"clip-higher"``: OpenRLHF's own fixed clip :math:`[1-\varepsilon_{low},
  1+\varepsilon_{high}]` (``--actor.eps_clip_low_high``; both methods read it, OpenRLHF always sets both sides),
  through the same call: the loss and every returned metric are OpenRLHF's, bit for bit.
- ``band_loss_form="dppo"``: DPPO's masked truncated-IS objective (:mod:`bandcore.rl.loss`,
  :func:`bandcore.rl.per_token_policy_loss`) aggregated by OpenRLHF's ``aggregate_loss``; ``clip_ratio`` is the
  fraction of tokens dropped, ``ppo_kl`` OpenRLHF's.  OpenRLHF's surrogate has no such form, so it does not run
  with OpenRLHF's mismatch correction (``is_correction_level`` must be ``off``) or its dual clip.
- ``band_anchor="rollout"``: the Band of the rollout engine's probability :math:`p_a` (``rollout_log_probs``,
  which OpenRLHF passes only with ``--algo.advantage.is_correction_level`` token or seq), bounding
  :math:`\pi/\pi_a`: for :math:`r = \pi/p` the clip is :math:`[l\,p_a/p,\ u\,p_a/p]`.

**The Band as the mismatch gate** (``band_gate``, a divergence).  OpenRLHF's token-level ratio gate
(``--algo.advantage.is_correction_level token``, ``is_correction_gating ratio``) keeps a token whose
:math:`w = \pi_{old}/\pi_{rollout}` lies in ``is_correction_threshold`` = [low, high] (mask mode: weight
:math:`w`, else 0; clip mode: weight clamp(w, low, high)).  With ``band_gate`` the interval becomes, per token, the
Band :math:`[l(p_a, \delta), u(p_a, \delta)]` of the rollout probability :math:`p_a`, with δ the gate's threshold
given as one value (``--algo.advantage.is_correction_threshold δ``, which OpenRLHF reads as [0, δ]): a token is
gated when the trainer's distribution cannot be within :math:`D_f \le \delta` of the rollout's.  By Jensen's
inequality :math:`w \in [l, u]` iff :math:`g_f(p_a, w) \le \delta`, so ``band_gate="kl"`` is OpenRLHF's
``binary_kl`` gate and ``band_gate="tv"`` its ``tv`` gate (up to their clamp of probabilities to
[1e-6, 1 - 1e-6]), and any other divergence is gated the same way.

**Refused** (``ValueError`` naming the argument and its flag): the Band, the dppo form or the gate with
``policy_loss_type="gspo"`` (one ratio per sequence; ``band_method="clip"`` runs GSPO as OpenRLHF does); the dppo
form with a dual clip or with ``is_correction_level`` other than ``off``; ``band_gate`` without the token-level
ratio gate or with a threshold that is not one radius; every bad ``band_*`` value (:class:`BandSettings`).

**Steps.**  OpenRLHF passes the loss no step count, so a schedule or the controller counts optimizer steps with
:class:`bandcore.rl.steps.OptimizerStepCounter` (DeepSpeed steps a torch optimizer); each process counts its own
from 0.  The δ in use and the mean Band width of the last call are in ``loss.band_metrics`` (OpenRLHF's actor logs
only the returned tuple).

**On-policy.**  The old log-probabilities are computed with the weights that generated the batch, so the ratio
moves only when a rollout batch takes more than one optimizer step (``--train.max_epochs`` > 1, or
``--rollout.batch_size`` × ``--rollout.n_samples_per_prompt`` above ``--train.batch_size``); the launcher
checks it.

The inputs are checked on every call (``band_check=False``: structure only, no host synchronisation).
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any, ClassVar

import torch
from openrlhf.models.loss import PolicyLoss, aggregate_loss
from openrlhf.models.utils import masked_mean

from .loss import per_token_policy_loss
from .loss_inputs import check_policy_loss_inputs
from .settings import BandSettings
from .steps import OptimizerStepCounter

__all__ = ["BAND_KEYS", "HOST_FLAGS", "TESTED_OPENRLHF", "BandPolicyLoss", "band_policy_loss_class"]

#: The OpenRLHF version the tests run against.
TESTED_OPENRLHF = "0.11.2"
#: The constructor's Band keywords: ``band_<field>`` of BandSettings (the fixed clip and the dual clip are
#: OpenRLHF's own arguments) and ``band_gate``.
_HOST_FIELDS = ("clip_eps", "clip_eps_high", "dual_clip", "key_prefix", "key_names")
BAND_KEYS = (*(f"band_{f.name}" for f in fields(BandSettings) if f.name not in _HOST_FIELDS), "band_gate")
#: PolicyLoss's arguments that the Band reads -> the train_ppo_ray flag that sets them.
HOST_FLAGS = {"clip_eps_low": "--actor.eps_clip_low_high", "clip_eps_high": "--actor.eps_clip_low_high",
              "dual_clip": "--actor.dual_clip", "policy_loss_type": "--actor.policy_loss_type",
              "is_correction_level": "--algo.advantage.is_correction_level",
              "is_correction_gating": "--algo.advantage.is_correction_gating",
              "is_correction_threshold": "--algo.advantage.is_correction_threshold"}
#: BandSettings fields read from PolicyLoss's own arguments.
_HOST_KEYS = {"clip_eps": "clip_eps_low", "clip_eps_high": "clip_eps_high", "dual_clip": "dual_clip"}
#: bandcore's input names in errors -> OpenRLHF's.
_INPUT_NAMES = {"log_prob": "log_probs", "old_log_prob": "old_log_probs", "mask": "action_mask",
                "anchor_log_prob": "rollout_log_probs"}
_INPUT_NAME = re.compile(r"\b(old_log_prob|anchor_log_prob|log_prob|mask)\b")
_probed = False


def _named(key: str) -> str:
    return f"{key} ({HOST_FLAGS[key]})" if key in HOST_FLAGS else key


def _probe_openrlhf() -> None:
    """Check once per process that OpenRLHF's ``PolicyLoss.forward`` reads the clip and the gate's thresholds at
    call time and broadcasts tensors, as this plug-in relies on (an OpenRLHF that stopped would be ignored
    silently otherwise)."""
    global _probed
    if _probed:
        return
    one = torch.ones(1, 2, dtype=torch.float64)
    probe = PolicyLoss(is_correction_level="token", is_correction_gating="ratio")
    probe.clip_eps_low, probe.clip_eps_high = torch.tensor([[0.5, 0.0]]) * one, 0 * one
    probe.is_correction_threshold = (torch.tensor([[0.5, 2.0]]) * one, torch.tensor([[2.0, 3.0]]) * one)
    out = probe(math.log(0.6) * one, 0 * one, -one, action_mask=one.bool(), rollout_log_probs=-math.log(1.5) * one)
    # ratio 0.6, A = -1: the first token's lower bound 0.5 lets it be, the second's (1.0) clips it to 1;
    # w = 1.5 lies in the first token's gate [0.5, 2] only
    if not (isinstance(out, tuple) and len(out) == 5 and out[1].item() == 0.5 and out[4].item() == 0.5):
        raise RuntimeError(
            "OpenRLHF's PolicyLoss.forward no longer reads clip_eps_low / clip_eps_high and is_correction_threshold "
            f"per call as tensors (or returns another tuple), so BandPolicyLoss cannot set the Band's bounds; "
            f"bandcore.rl.openrlhf is tested with OpenRLHF {TESTED_OPENRLHF}"
        )
    _probed = True


class BandPolicyLoss(PolicyLoss):
    """OpenRLHF's ``PolicyLoss`` with the Band (module docstring): ``PolicyLoss``'s arguments plus ``band_*``.

    Attributes
    ----------
    band_settings
        The :class:`BandSettings` (validated when built).
    band_bounds
        Its bounds provider (:class:`bandcore.rl.provider.BandBounds`).
    band_metrics
        The δ in use (``band/delta``, or ``band/delta_low`` and ``band/delta_high``) and ``band/width_mean``
        (mean :math:`u - l` over the last call's tokens, a tensor), when the Band's bounds were computed.
    """

    #: ``band_*`` keywords a configured subclass (:func:`band_policy_loss_class`) supplies by default
    band_defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        band = {**self.band_defaults, **{k: kwargs.pop(k) for k in list(kwargs) if k.startswith("band_")}}
        unknown = sorted(set(band) - set(BAND_KEYS))
        if unknown:
            raise TypeError(f"BandPolicyLoss got unknown Band keyword(s) {unknown}; allowed: {BAND_KEYS}")
        super().__init__(*args, **kwargs)
        _probe_openrlhf()
        gate = band.pop("band_gate", None)
        host = {"clip_eps_low": self.clip_eps_low, "clip_eps_high": self.clip_eps_high, "dual_clip": self.dual_clip}
        if band.get("band_method", "band") == "band":  # the fixed clip is unused: not checked
            host = {"dual_clip": self.dual_clip}
        self.band_settings = BandSettings.from_host({**band, **host}, prefix="band_", names=_HOST_KEYS)
        self.band_bounds = self.band_settings.bounds_provider()
        self._gate = self._gate_bounds(gate)
        self._check_host()
        s = self.band_settings
        self._passthrough = s.method != "band" and s.loss_form == "clip" and s.anchor == "old" and self._gate is None
        self._steps = OptimizerStepCounter(self.band_bounds) if s.moving else None
        self.band_metrics: dict[str, Any] = {}

    def _gate_bounds(self, gate: Any):
        if gate is None:
            return None
        if self.is_correction_level != "token" or self.is_correction_gating != "ratio":
            raise ValueError(
                f"band_gate={gate!r} makes OpenRLHF's token-level ratio gate read the Band: it needs "
                f"{_named('is_correction_level')}='token' and {_named('is_correction_gating')}='ratio', got "
                f"{self.is_correction_level!r} and {self.is_correction_gating!r}")
        threshold = tuple(self.is_correction_threshold)
        if len(threshold) != 2 or threshold[0] != 0:
            raise ValueError(
                f"band_gate={gate!r} takes its radius from {_named('is_correction_threshold')} given as one value "
                f"δ (OpenRLHF reads it as [0, δ]), got {list(threshold)!r}")
        settings = BandSettings(divergence=gate, delta=threshold[1],
                                key_names=(("delta", "is_correction_threshold"), ("divergence", "band_gate")))
        return settings.bounds_provider()

    def _check_host(self) -> None:
        s = self.band_settings
        if self.policy_loss_type != "ppo" and (s.method == "band" or s.loss_form == "dppo" or self._gate is not None):
            raise ValueError(
                f"{_named('policy_loss_type')}={self.policy_loss_type!r} has one ratio per sequence, and the Band "
                "bounds each token's ratio: use 'ppo', or band_method='clip' to run OpenRLHF's own loss")
        if s.loss_form == "dppo" and self.is_correction_level != "off":
            raise ValueError(
                f"band_loss_form='dppo' computes its own surrogate, without OpenRLHF's mismatch correction: "
                f"{_named('is_correction_level')} must be 'off', got {self.is_correction_level!r}")

    def _check_inputs(self, log_probs, old_log_probs, advantages, mask, rollout) -> None:
        try:
            check_policy_loss_inputs(log_probs, old_log_probs, advantages, mask, values=self.band_settings.check,
                                     anchor_log_prob=rollout)
        except (TypeError, ValueError) as err:
            message = _INPUT_NAME.sub(lambda m: _INPUT_NAMES[m.group(1)], str(err))
            raise type(err)(f"BandPolicyLoss: {message}") from None

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor | None = None,
        rollout_log_probs: torch.Tensor | None = None,
        dp_size: int = 1,
        batch_num_tokens: float | None = None,
        global_batch_size: float | None = None,
    ):
        """OpenRLHF's ``PolicyLoss.forward`` with the Band's per-token bounds (module docstring); returns
        ``(loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio)`` as OpenRLHF's."""
        s = self.band_settings
        mask = torch.ones_like(log_probs, dtype=torch.bool) if action_mask is None else action_mask
        needs_rollout = s.anchor == "rollout" or self._gate is not None
        if needs_rollout and rollout_log_probs is None:
            why = "band_anchor='rollout'" if s.anchor == "rollout" else "band_gate"
            raise ValueError(f"{why} needs rollout_log_probs, and this call passed none (OpenRLHF passes them with "
                             f"{HOST_FLAGS['is_correction_level']} token or seq)")
        self._check_inputs(log_probs, old_log_probs, advantages, mask, rollout_log_probs if needs_rollout else None)
        if self._steps is not None and log_probs.requires_grad and torch.is_grad_enabled():
            self._steps.record(log_probs, old_log_probs, mask)
        tail = (dp_size, batch_num_tokens, global_batch_size)
        if self._passthrough:
            self.band_metrics = {}
            return super().forward(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, *tail)
        valid = mask != 0
        anchor = rollout_log_probs if s.anchor == "rollout" else None
        eps_low, eps_high = self.clip_eps_low, self.clip_eps_high  # a fixed clip at the old policy: OpenRLHF's
        self.band_metrics = {}
        if s.loss_form == "dppo" or s.method == "band" or anchor is not None:
            base = old_log_probs if anchor is None else anchor
            log_lower, log_upper = self.band_bounds.log_bounds(torch.where(valid, base.detach(), 0.0).double())
            self.band_metrics = {f"band/{k}": v for k, v in self.band_bounds.metrics().items()}
            with torch.no_grad():
                self.band_metrics["band/width_mean"] = masked_mean(torch.exp(log_upper) - torch.exp(log_lower), mask)
            if s.loss_form == "dppo":
                return self._dppo(log_probs, old_log_probs, advantages, mask, anchor, (log_lower, log_upper), tail)
            if anchor is not None:  # bounds of pi / pi_a, as bounds of r = pi / pi_old
                shift = torch.where(valid, anchor.detach().double() - old_log_probs.detach().double(), 0.0)
                log_lower, log_upper = log_lower + shift, log_upper + shift
            dtype = torch.result_type(log_probs, old_log_probs)
            eps_low = torch.where(valid, 1.0 - torch.exp(log_lower), float(self.clip_eps_low)).to(dtype)
            eps_high = torch.where(valid, torch.exp(log_upper) - 1.0, float(self.clip_eps_high)).to(dtype)
        threshold = self.is_correction_threshold
        if self._gate is not None:
            gate_dtype = torch.result_type(old_log_probs, rollout_log_probs)
            at = torch.where(valid, rollout_log_probs.detach(), 0.0).double()
            gate_lower, gate_upper = self._gate.log_bounds(at)
            threshold = (torch.exp(gate_lower).to(gate_dtype), torch.exp(gate_upper).to(gate_dtype))
        saved = (self.clip_eps_low, self.clip_eps_high, self.is_correction_threshold)
        self.clip_eps_low, self.clip_eps_high, self.is_correction_threshold = eps_low, eps_high, threshold
        try:
            return super().forward(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs, *tail)
        finally:
            self.clip_eps_low, self.clip_eps_high, self.is_correction_threshold = saved

    def _dppo(self, log_probs, old_log_probs, advantages, mask, anchor, log_bounds, tail):
        """The dppo form with OpenRLHF's aggregation; ``clip_ratio`` is the fraction of tokens dropped."""
        dp_size, batch_num_tokens, global_batch_size = tail
        pg_losses, metrics = per_token_policy_loss(
            log_probs, old_log_probs, advantages, mask, log_bounds=log_bounds, check=False, loss_form="dppo",
            clip_ratio_c=self.band_settings.clip_ratio_c, anchor_log_prob=anchor)
        loss = aggregate_loss(pg_losses, mask, token_level_loss=self.token_level_loss, dp_size=dp_size,
                              batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size)
        ppo_kl = masked_mean(-(log_probs - old_log_probs).detach(), mask, dim=None)
        return loss, metrics["clipfrac"], ppo_kl, None, None


def band_policy_loss_class(**band: Any) -> type[BandPolicyLoss]:
    """A subclass of :class:`BandPolicyLoss` whose ``band_*`` keywords default to ``band``, for hosts that build
    the loss with ``PolicyLoss``'s arguments only (OpenRLHF's actor; :mod:`bandcore.rl.openrlhf_launch`).

    The keywords are checked here (names and values), so a bad setting fails where the class is installed."""
    unknown = sorted(set(band) - set(BAND_KEYS))
    if unknown:
        raise TypeError(f"unknown Band keyword(s) {unknown}; allowed: {BAND_KEYS}")
    settings = {k: v for k, v in band.items() if k != "band_gate"}
    BandSettings.from_host(settings, prefix="band_")
    return type("BandPolicyLoss", (BandPolicyLoss,), {"band_defaults": dict(band), "__module__": __name__})

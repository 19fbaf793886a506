r"""BandPO in verl: the policy loss ``"bandpo"`` in verl's registry, and its config class.

Importing this module registers the loss (``verl.trainer.ppo.core_algos.register_policy_loss``) in the
importing process.  Select it and set its hyperparameters with hydra overrides::

    actor_rollout_ref.actor.policy_loss._target_=bandcore.rl.verl.BandPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=bandpo
    +actor_rollout_ref.actor.policy_loss.band_divergence=kl
    +actor_rollout_ref.actor.policy_loss.band_delta=0.05
    +actor_rollout_ref.actor.policy_loss.band_max_ratio=10
    actor_rollout_ref.actor.clip_ratio_c=10          # dual clip for A < 0 (verl's own key)

(``+`` because the band keys are not in verl's yaml; ``_target_`` makes verl build
:class:`BandPolicyLossConfig`, whose fields are checked, and importing that class registers the loss in every
process that builds the config.)  Registration is per process; Ray workers get it by any of

- ``_target_`` above (the worker imports this module to build its config);
- the entry point ``bandcore = "bandcore.rl.verl"`` in the group ``verl.plugins`` that ``pip install bandcore``
  declares: ``import verl`` (0.9+) loads it unless ``VERL_USE_EXTERNAL_PLUGINS=none``;
- the environment variable ``VERL_USE_EXTERNAL_MODULES=bandcore.rl.verl``, read by ``import verl``, forwarded to
  the workers with ``+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=bandcore.rl.verl``.

The loss is :func:`bandcore.rl.per_token_policy_loss` with the Band bounds (or, with ``band_method``, a fixed
clip from verl's ``clip_ratio_low`` / ``clip_ratio_high``, for baselines run through the same code), the dual
clip :math:`c` = ``clip_ratio_c`` as in verl's ``vanilla`` loss, the rollout-correction weights multiplied in,
and verl's own ``agg_loss`` (with ``**config.global_batch_info`` from 0.7 on, so data-parallel scaling is
verl's).  Unlike ``vanilla`` the log-ratio is not clamped to ±20 before ``exp``.  The inputs are checked on
every call (one host synchronisation; ``band_check=False`` turns it off), and a token whose old log-prob is
``-inf`` contributes 0 to the loss and its gradient (see :mod:`bandcore.rl.loss`).

Return convention: verl >= 0.7 expects ``(pg_loss, metrics)`` with float metrics ``actor/pg_clipfrac`` (the
Band's clip fraction), ``actor/ppo_kl`` (mean :math:`-\log r`) and ``actor/pg_clipfrac_lower`` (the dual
clip's fraction, as in ``vanilla``), here beside ``actor/band_clipfrac_high``, ``actor/band_clipfrac_low``,
``actor/band_width`` and ``actor/pg_clipfrac_fixed`` (fixed clip [0.8, 1.2]); verl 0.5–0.6 expect the
4-tuple ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``.  The installed version decides.

Pitfall: ``algorithm.rollout_correction.bypass_mode=True`` makes verl overwrite ``policy_loss.loss_mode``
with ``"bypass_mode"``, silently replacing ``bandpo``; keep it ``False`` (the default, "decoupled" mode).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import verl
from packaging.version import Version
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
from verl.workers.config import PolicyLossConfig

from .bounds import METHODS, check_bound_settings
from .loss import per_token_policy_loss

__all__ = ["LOSS_NAME", "BandPolicyLossConfig", "compute_policy_loss_bandpo"]

LOSS_NAME = "bandpo"

#: verl 0.7 changed the policy-loss return value from a 4-tuple to (loss, metrics dict).
RETURNS_METRICS_DICT = Version(verl.__version__) >= Version("0.7")
#: ... and gave ``agg_loss`` the global-batch keyword arguments that ``config.global_batch_info`` fills.
AGG_LOSS_TAKES_BATCH_INFO = "global_batch_size" in inspect.signature(agg_loss).parameters


@dataclass
class BandPolicyLossConfig(PolicyLossConfig):
    r"""verl's ``PolicyLossConfig`` plus the Band's hyperparameters; ``loss_mode`` defaults to ``"bandpo"``.

    Parameters
    ----------
    band_divergence
        f-divergence of the trust region (any spelling of :func:`bandcore.divergences.get_divergence`: name,
        alias, ``alpha(a)``, a formula in ``u``); ``"kl"`` is :math:`KL(\pi_{old}\|\pi)`, BandPO's choice.
    band_delta
        Radius :math:`\delta > 0` of the trust region (BandPO: 0.05).
    band_max_ratio
        Optional cap (> 1) on the upper ratio bound :math:`u` (the BandPO runs used 10).
    band_method
        ``"band"``; or ``"clip"`` / ``"clip-higher"`` for the fixed clip
        :math:`[1 - \text{clip\_ratio\_low}, 1 + \text{clip\_ratio\_high}]` through the same loss.
    band_check
        Check the loss inputs' values on every call (one host synchronisation; see
        :func:`bandcore.rl.loss.check_policy_loss_inputs`); ``False`` skips it for speed.
    """

    loss_mode: str = LOSS_NAME
    band_divergence: str = "kl"
    band_delta: float = 0.05
    band_max_ratio: float | None = None
    band_method: str = "band"
    band_check: bool = True

    def __post_init__(self) -> None:
        if hasattr(super(), "__post_init__"):
            super().__post_init__()
        if not isinstance(self.band_divergence, str):
            raise TypeError(f"band_divergence must be a divergence name or alias (str), got {self.band_divergence!r}")
        if self.band_method not in METHODS:
            raise ValueError(f"band_method must be one of {METHODS}, got {self.band_method!r}")
        if not isinstance(self.band_check, bool):
            raise TypeError(f"band_check must be True or False, got {self.band_check!r}")
        # the loss's own checks and messages; the divergence by bandcore.divergences.get_divergence
        check_bound_settings(divergence=self.band_divergence, delta=self.band_delta, max_ratio=self.band_max_ratio)


def _band_settings(config: Any) -> dict[str, Any]:
    """The Band keys from ``config.policy_loss`` (a BandPolicyLossConfig or a DictConfig), with defaults."""
    policy_loss = config.get("policy_loss", None)
    get = policy_loss.get if policy_loss is not None else (lambda _key, default: default)
    method = get("band_method", "band")
    clip_low = config.get("clip_ratio_low", None)
    clip_high = config.get("clip_ratio_high", None)
    clip = config.get("clip_ratio", 0.2)
    return {
        "divergence": get("band_divergence", "kl"),
        "delta": get("band_delta", 0.05),
        "max_ratio": get("band_max_ratio", None),
        "method": method,
        "clip_eps": clip if clip_low is None else clip_low,
        "clip_eps_high": clip if clip_high is None else clip_high,
        "check": bool(get("band_check", True)),
    }


def _bandpo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
    *,
    metrics_dict: bool,
    batch_info: bool,
):
    if config is None:
        raise ValueError("config must be verl's actor config (it carries policy_loss and clip_ratio_c), got None")
    dual_clip = config.get("clip_ratio_c", 3.0)
    pg_losses, metrics = per_token_policy_loss(
        log_prob, old_log_prob, advantages, response_mask, dual_clip=dual_clip, **_band_settings(config)
    )
    if dual_clip is None:  # clip_ratio_c: null disables the dual clip
        metrics["dual_clipfrac"] = torch.zeros_like(metrics["clipfrac"])
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    extra = dict(config.get("global_batch_info", None) or {}) if batch_info else {}
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **extra)
    if not metrics_dict:
        return pg_loss, metrics["clipfrac"], metrics["approx_kl"], metrics["dual_clipfrac"]
    names = {
        "actor/pg_clipfrac": "clipfrac",
        "actor/ppo_kl": "approx_kl",
        "actor/pg_clipfrac_lower": "dual_clipfrac",
        "actor/band_clipfrac_high": "clipfrac_high",
        "actor/band_clipfrac_low": "clipfrac_low",
        "actor/band_width": "band_width",
        "actor/pg_clipfrac_fixed": "clipfrac_fixed",
    }
    values = torch.stack([metrics[key] for key in names.values()]).tolist()  # one host sync
    return pg_loss, dict(zip(names, values, strict=True))


@register_policy_loss(LOSS_NAME)
def compute_policy_loss_bandpo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
):
    r"""verl policy loss ``"bandpo"``: :math:`\max(-A r, -A\,\mathrm{clip}(r, l(p), u(p)))`, dual-clipped.

    Parameters follow verl's policy-loss protocol: (B, T) ``old_log_prob``, ``log_prob``, ``advantages``,
    ``response_mask``; ``config`` is the actor config (``policy_loss`` holds the band keys of
    :class:`BandPolicyLossConfig`, missing keys take its defaults; ``clip_ratio_c`` is the dual clip);
    ``rollout_is_weights`` multiply the per-token loss before aggregation.  Returns ``(pg_loss, metrics)``
    (verl >= 0.7) or ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` (verl < 0.7); see the module
    docstring.
    """
    return _bandpo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
                   metrics_dict=RETURNS_METRICS_DICT, batch_info=AGG_LOSS_TAKES_BATCH_INFO)

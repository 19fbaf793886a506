r"""BandPO in verl: the policy loss ``"bandpo"`` in verl's registry, and its config class.

Importing this module registers the loss (``verl.trainer.ppo.core_algos.register_policy_loss``) in the
importing process.  Select it and set its hyperparameters with hydra overrides::

    actor_rollout_ref.actor.policy_loss._target_=bandcore.rl.verl.BandPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=bandpo
    +actor_rollout_ref.actor.policy_loss.band_divergence=kl
    +actor_rollout_ref.actor.policy_loss.band_delta=0.05
    +actor_rollout_ref.actor.policy_loss.band_max_ratio=10
    actor_rollout_ref.actor.clip_ratio_c=10          # dual clip for A < 0 (verl's own key)

The other keys (all optional, ``+`` prefixed, validated by :class:`bandcore.rl.settings.BandSettings`):
``band_delta_low`` / ``band_delta_high`` (one-sided radii), ``band_loss_form`` (``clip`` or ``dppo``; the dppo
form truncates at verl's ``clip_ratio_c``, as verl's ``dppo_kl`` / ``dppo_tv``), ``band_delta_schedule`` with
``band_delta_end`` / ``band_delta_steps`` / ``band_delta_hold_steps``, ``band_target_kl`` with ``band_kl_rate`` /
``band_delta_min`` / ``band_delta_max``, ``band_anchor`` (``old`` or ``rollout``), ``band_method``, ``band_check``.

(``+`` because the band keys are not in verl's yaml; ``_target_`` makes verl build
:class:`BandPolicyLossConfig`, whose fields are checked, and importing that class registers the loss in every
process that builds the config.)  Registration is per process; Ray workers get it by any of

- ``_target_`` above (the worker imports this module to build its config);
- the entry point ``bandcore = "bandcore.rl.verl"`` in the group ``verl.plugins`` that ``pip install bandcore``
  declares: ``import verl`` (0.9+) loads it unless ``VERL_USE_EXTERNAL_PLUGINS=none``;
- the environment variable ``VERL_USE_EXTERNAL_MODULES=bandcore.rl.verl``, read by ``import verl``, forwarded to
  the workers with ``+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES=bandcore.rl.verl``.

The loss is :func:`bandcore.rl.per_token_policy_loss` (``clip`` or ``dppo`` form) with the Band bounds (or,
with ``band_method``, a fixed clip from verl's ``clip_ratio_low`` / ``clip_ratio_high``, for baselines run through
the same code), the dual clip :math:`c` = ``clip_ratio_c`` as in verl's ``vanilla`` loss (the dppo form: the
truncation :math:`C` = ``clip_ratio_c``, as in verl's ``dppo_kl``), the rollout-correction weights multiplied in,
and verl's own ``agg_loss`` (with ``**config.global_batch_info`` from 0.7 on, so data-parallel scaling is
verl's).  Unlike ``vanilla`` the log-ratio is not clamped to ±20 before ``exp``.  The inputs are checked on
every call (one host synchronisation; ``band_check=False`` turns it off), and a token whose old log-prob is
``-inf`` contributes 0 to the loss and its gradient (see :mod:`bandcore.rl.loss`).

Return convention: verl >= 0.7 expects ``(pg_loss, metrics)`` with float metrics ``actor/pg_clipfrac`` (the
Band's clip fraction), ``actor/ppo_kl`` (mean :math:`-\log r`) and ``actor/pg_clipfrac_lower`` (the dual
clip's fraction, as in ``vanilla``), here beside ``actor/band_clipfrac_high``, ``actor/band_clipfrac_low``,
``actor/band_width``, ``actor/pg_clipfrac_fixed`` (fixed clip [0.8, 1.2]) and the radius in use,
``actor/band_delta`` (``actor/band_delta_low`` / ``actor/band_delta_high`` when they differ); in the dppo form
``actor/pg_clipfrac`` is the fraction of tokens dropped and ``actor/pg_clipfrac_lower`` that of kept tokens
truncated at :math:`C` (as verl's ``dppo_*``).  verl 0.5–0.6 expect the
4-tuple ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)``.  The installed version decides.

**Steps.**  verl 0.9.1 passes the loss no step count (``config.global_batch_info`` holds ``dp_size``,
``batch_num_tokens``, ``global_batch_size`` and ``loss_scale_factor`` only), so a schedule or the controller
counts optimizer steps itself: a global ``torch.optim`` post-step hook, registered when such a loss is first
built, counts every optimizer step that follows a call of this loss with gradient (whatever optimizer the
engine wraps; several inner optimizers in one step count once).  The count is per process and starts at 0: a run
resumed from a checkpoint restarts its schedule, and with data parallelism each rank's controller measures the
KL of its own micro-batches (ranks may hold slightly different δ); use a schedule where that matters.

**Anchor.**  ``band_anchor="rollout"`` needs the rollout engine's log-probabilities as the keyword argument
``rollout_log_probs``; verl 0.9.1's actor loss (``verl.workers.utils.losses.ppo_loss``) passes a policy loss only
``old_log_prob``, ``log_prob``, ``advantages``, ``response_mask``, ``loss_agg_mode``, ``config`` and
``rollout_is_weights``, so with it the loss raises ``ValueError`` naming ``rollout_log_probs``; a caller that
passes them (a custom actor loss) gets the Band of the rollout policy.

**On-policy.**  verl computes the old log-probabilities with the weights that generated the batch, so the ratio
moves only when a batch takes more than one optimizer step (``ppo_epochs > 1`` or ``ppo_mini_batch_size`` below
the train batch size); the loss cannot see the train batch size, so nothing is checked here.

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
from torch.optim.optimizer import register_optimizer_step_post_hook
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss
from verl.workers.config import PolicyLossConfig

from .loss import per_token_policy_loss
from .provider import BandBounds
from .settings import BandSettings

__all__ = ["HOST_KEYS", "LOSS_NAME", "BandPolicyLossConfig", "band_settings", "compute_policy_loss_bandpo",
           "reset_step_state"]

LOSS_NAME = "bandpo"

#: verl 0.7 changed the policy-loss return value from a 4-tuple to (loss, metrics dict).
RETURNS_METRICS_DICT = Version(verl.__version__) >= Version("0.7")
#: ... and gave ``agg_loss`` the global-batch keyword arguments that ``config.global_batch_info`` fills.
AGG_LOSS_TAKES_BATCH_INFO = "global_batch_size" in inspect.signature(agg_loss).parameters
#: BandSettings fields read from verl's own actor keys (the rest: ``band_<field>`` in ``policy_loss``).
HOST_KEYS = {"dual_clip": "clip_ratio_c", "clip_ratio_c": "clip_ratio_c", "clip_eps": "clip_ratio_low",
             "clip_eps_high": "clip_ratio_high"}


@dataclass
class BandPolicyLossConfig(PolicyLossConfig):
    r"""verl's ``PolicyLossConfig`` plus the Band's hyperparameters; ``loss_mode`` defaults to ``"bandpo"``.

    Each ``band_<name>`` is the field ``<name>`` of :class:`bandcore.rl.settings.BandSettings` (see there and
    the module docstring), checked when the config is built.  ``band_delta`` unset is 0.05 unless
    ``band_delta_low`` / ``band_delta_high`` are set.  verl's own actor keys complete them at loss time:
    ``clip_ratio_c`` (the dual clip, or the dppo form's truncation :math:`C`) and ``clip_ratio_low`` /
    ``clip_ratio_high`` (the fixed clip of ``band_method="clip"``).
    """

    loss_mode: str = LOSS_NAME
    band_divergence: str = "kl"
    band_delta: float | None = None
    band_delta_low: float | None = None
    band_delta_high: float | None = None
    band_max_ratio: float | None = None
    band_method: str = "band"
    band_loss_form: str = "clip"
    band_delta_schedule: str = "constant"
    band_delta_end: float | None = None
    band_delta_steps: int | None = None
    band_delta_hold_steps: int = 0
    band_target_kl: float | None = None
    band_kl_rate: float = BandSettings.kl_rate
    band_delta_min: float = BandSettings.delta_min
    band_delta_max: float = BandSettings.delta_max
    band_anchor: str = "old"
    band_check: bool = True

    def __post_init__(self) -> None:
        if hasattr(super(), "__post_init__"):
            super().__post_init__()
        if not isinstance(self.band_divergence, str):
            raise TypeError(f"band_divergence must be a divergence name or alias (str), got {self.band_divergence!r}")
        BandSettings.from_host(self, prefix="band_", names=HOST_KEYS)  # the Band's checks, naming band_* keys


def band_settings(config: Any) -> BandSettings:
    """The :class:`BandSettings` of verl's actor ``config`` (an ``ActorConfig`` or ``DictConfig``): the band keys
    of ``config.policy_loss`` (missing ones default) and verl's ``clip_ratio_c``, ``clip_ratio_low`` /
    ``clip_ratio_high`` (falling back to ``clip_ratio``), read as verl's own losses read them."""
    policy_loss = config.get("policy_loss", None)
    if policy_loss is None:
        policy_loss = {}
    clip = config.get("clip_ratio", 0.2)
    clip_low, clip_high = config.get("clip_ratio_low", None), config.get("clip_ratio_high", None)
    c = config.get("clip_ratio_c", 3.0)  # verl's ActorConfig default; null: no dual clip
    dppo = policy_loss.get("band_loss_form", "clip") == "dppo"
    return BandSettings.from_host(
        policy_loss, prefix="band_", names=HOST_KEYS,
        clip_eps=clip if clip_low is None else clip_low, clip_eps_high=clip if clip_high is None else clip_high,
        dual_clip=None if dppo else c, clip_ratio_c=c if dppo else None,
    )


# ---------------------------------------------------------------------------------------------------------
# Per-process state: one bounds provider per settings, and the optimizer-step hook of moving radii
# ---------------------------------------------------------------------------------------------------------

_PROVIDERS: dict[BandSettings, BandBounds] = {}
_USED_SINCE_STEP: dict[BandSettings, torch.Tensor] = {}  # (k3 sum, token count) since the last step
_STEP_HOOK: Any = None


def _on_optimizer_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
    """An optimizer step: every moving provider used since the last one advances (its controller told the KL)."""
    for settings, totals in list(_USED_SINCE_STEP.items()):
        provider = _PROVIDERS[settings]
        kl_sum, tokens = totals.tolist()  # one host synchronisation per optimizer step
        if tokens > 0:
            provider.record_kl(kl_sum / tokens)
        provider.advance()
    _USED_SINCE_STEP.clear()


def reset_step_state() -> None:
    """Forget this process's step counts and controller states (a new run in the same process; tests).

    The plug-in keeps one bounds provider per distinct :class:`BandSettings` in a process: two losses with the
    same settings share their step count."""
    _PROVIDERS.clear()
    _USED_SINCE_STEP.clear()


def _provider(settings: BandSettings) -> BandBounds:
    global _STEP_HOOK
    provider = _PROVIDERS.get(settings)
    if provider is None:
        provider = _PROVIDERS[settings] = settings.bounds_provider()
        if settings.moving and _STEP_HOOK is None:
            _STEP_HOOK = register_optimizer_step_post_hook(_on_optimizer_step)
    return provider


def _record_step_use(settings: BandSettings, log_prob, old_log_prob, mask) -> None:
    """Note a training call of a moving radius: the step hook advances it; the controller gets its KL."""
    with torch.no_grad():
        log_ratio = log_prob.detach() - old_log_prob.detach()
        weights = (mask != 0) & torch.isfinite(log_ratio)
        k3 = torch.where(weights, torch.expm1(log_ratio) - log_ratio, 0.0)
        totals = torch.stack([k3.sum().to(torch.float64), weights.sum().to(torch.float64)])
    previous = _USED_SINCE_STEP.get(settings)
    _USED_SINCE_STEP[settings] = totals if previous is None else previous + totals


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
    rollout_log_probs: torch.Tensor | None = None,
):
    if config is None:
        raise ValueError("config must be verl's actor config (it carries policy_loss and clip_ratio_c), got None")
    settings = band_settings(config)
    if settings.anchor == "rollout" and rollout_log_probs is None:
        raise ValueError(
            "band_anchor='rollout' needs the rollout engine's log-probabilities as rollout_log_probs, and this call "
            "passed none (verl 0.9.1's actor loss passes old_log_prob and rollout_is_weights only); set band_anchor="
            "'old', or call the loss with rollout_log_probs"
        )
    provider = _provider(settings)
    anchor = rollout_log_probs if settings.anchor == "rollout" else None
    valid = response_mask != 0
    at = torch.where(valid, old_log_prob if anchor is None else anchor, 0.0).detach()
    log_bounds = provider.log_bounds(at)
    pg_losses, metrics = per_token_policy_loss(
        log_prob, old_log_prob, advantages, response_mask, dual_clip=settings.dual_clip, log_bounds=log_bounds,
        check=settings.check, loss_form=settings.loss_form, clip_ratio_c=settings.clip_ratio_c,
        anchor_log_prob=anchor,
    )
    if settings.moving and log_prob.requires_grad and torch.is_grad_enabled():
        _record_step_use(settings, log_prob, old_log_prob, response_mask)
    lower_key = "truncfrac" if settings.loss_form == "dppo" else "dual_clipfrac"
    if lower_key not in metrics:  # clip_ratio_c: null disables the dual clip
        metrics[lower_key] = torch.zeros_like(metrics["clipfrac"])
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    extra = dict(config.get("global_batch_info", None) or {}) if batch_info else {}
    pg_loss = agg_loss(loss_mat=pg_losses, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **extra)
    if not metrics_dict:
        return pg_loss, metrics["clipfrac"], metrics["approx_kl"], metrics[lower_key]
    names = {
        "actor/pg_clipfrac": "clipfrac",
        "actor/ppo_kl": "approx_kl",
        "actor/pg_clipfrac_lower": lower_key,
        "actor/band_clipfrac_high": "clipfrac_high",
        "actor/band_clipfrac_low": "clipfrac_low",
        "actor/band_width": "band_width",
        "actor/pg_clipfrac_fixed": "clipfrac_fixed",
    }
    values = torch.stack([metrics[key] for key in names.values()]).tolist()  # one host sync
    out = dict(zip(names, values, strict=True))
    out.update({f"actor/band_{name}": value for name, value in provider.metrics().items()})
    return pg_loss, out


@register_policy_loss(LOSS_NAME)
def compute_policy_loss_bandpo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
):
    r"""verl policy loss ``"bandpo"``: the Band's clip or dppo form (:mod:`bandcore.rl.loss`).

    Parameters follow verl's policy-loss protocol: (B, T) ``old_log_prob``, ``log_prob``, ``advantages``,
    ``response_mask``; ``config`` is the actor config (``policy_loss`` holds the band keys of
    :class:`BandPolicyLossConfig`, missing keys take its defaults; ``clip_ratio_c`` is the dual clip, or the dppo
    form's truncation); ``rollout_is_weights`` multiply the per-token loss before aggregation;
    ``rollout_log_probs`` (B, T), needed by ``band_anchor="rollout"`` only.  Returns ``(pg_loss, metrics)``
    (verl >= 0.7) or ``(pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)`` (verl < 0.7); see the module
    docstring.
    """
    return _bandpo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights,
                   metrics_dict=RETURNS_METRICS_DICT, batch_info=AGG_LOSS_TAKES_BATCH_INFO,
                   rollout_log_probs=rollout_log_probs)

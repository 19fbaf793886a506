r"""Tunix plug-in: GRPO with per-token Band bounds, registered in Tunix's own policy-loss registry.

Importing this module registers the loss ``"band_grpo"`` (:data:`LOSS_NAME`) with
``tunix.rl.function_registry.register_policy_loss_fn``; :class:`BandGRPOConfig` is Tunix's ``GRPOConfig`` with
the Band's settings and that loss selected::

    from bandcore.rl.tunix import BandGRPOConfig
    config = BandGRPOConfig(num_generations=4, band_divergence="kl", band_delta=0.05, band_max_ratio=10.0,
                            epsilon_c=10.0)
    learner = GRPOLearner(rl_cluster=cluster, algo_config=config, reward_fns=reward)

**The loss** is Tunix's own ``grpo_loss_fn`` (``tunix/rl/algo_core.py``) with its clip
``jnp.clip(ratio, 1 - epsilon, 1 + epsilon_high)`` given per-token arrays: ``epsilon = 1 - l`` and
``epsilon_high = u - 1``, where :math:`[l, u]` is the Band of each token's old probability :math:`p`, the exact
interval of ratios :math:`\pi/\pi_{old}` that keeps the whole next-token distribution inside
:math:`D_f(\pi\|\pi_{old}) \le \delta`.  Everything else — the forward pass, Tunix's log-ratio clamp to ±20, the
dual clip (``epsilon_c``), the aggregation (``loss_agg_mode``), the KL penalty, the metrics — is Tunix's.  One
metric is added to ``aux``: ``band/width_mean``, the mean :math:`u - l` over completion tokens.

**The bounds** come from a certified lookup table read in JAX (:meth:`bandcore.BandTable.to_jax`; no torch,
no Numba, no callback, so the loss stays one jitted function): the shipped table of the divergence at δ when
there is one (1-D at δ ∈ {0.01, 0.02, 0.05, 0.1, 0.2}, else the 2-D table over [0.01, 0.2] restricted to δ), else
``band_table`` (a :class:`~bandcore.BandTable`, a :class:`~bandcore.tables.BandTable2D` or a path), else one is
built (``BandTable.build``; a minute or more, once per process).  They are computed in the working precision
(float32 unless ``jax_enable_x64``).

**Settings** (:class:`BandGRPOConfig`): the fields of :class:`bandcore.rl.settings.BandSettings` that Tunix
runs, spelled ``band_<field>`` and validated by it when the config is built (errors name the field):
``band_divergence`` (any spelling bandcore accepts), ``band_delta`` (δ > 0; 0.05 when no radius is given),
``band_delta_low`` / ``band_delta_high`` (separate radii for the lower and the upper bound; each defaults to
``band_delta``), ``band_max_ratio`` (cap :math:`u \le` it, > 1), ``band_method`` (``"clip"`` / ``"clip-higher"``:
Tunix's own ``epsilon`` / ``epsilon_high`` through the same loss, for baselines; clip-higher's default
:math:`\varepsilon_{high}` is 0.28) and ``band_allow_on_policy``; Tunix's dual clip ``epsilon_c`` is the settings'
``dual_clip`` (:data:`HOST_KEYS`); and ``band_table``.  ``config.band_settings`` holds the settings.  The Band's
options that Tunix cannot run are fields too, refused with the reason (:data:`REFUSED_SETTINGS`):
``band_loss_form="dppo"``, a moving radius (``band_delta_schedule``, ``band_target_kl``) and
``band_anchor="rollout"``.  ``num_iterations`` defaults to 2: with 1, Tunix computes no old log-probabilities, the
ratio is 1 and nothing clips, so the configuration is refused (:meth:`BandSettings.check_on_policy`) unless
``band_allow_on_policy=True``.  Nothing here imports torch or calls the exact solver: the bounds are tables.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from tunix.rl import algo_core, function_registry
from tunix.rl.grpo.grpo_learner import GRPOConfig

from bandcore.divergences import resolve_region

from .settings import BandSettings

__all__ = ["HOST_KEYS", "LOSS_NAME", "REFUSED_SETTINGS", "BandGRPOConfig", "band_bounds", "band_grpo_loss_fn",
           "band_settings"]

#: the name the loss is registered under in Tunix's policy-loss registry
LOSS_NAME = "band_grpo"
#: BandSettings fields read from Tunix's own keys (the rest: ``band_<field>``)
HOST_KEYS = {"clip_eps": "epsilon", "clip_eps_high": "epsilon_high", "dual_clip": "epsilon_c"}
_NO_STEP = "Tunix passes its policy loss no optimizer step, and the bounds are compiled into the jitted loss"
#: the BandSettings options Tunix cannot run: (field, value) -> the reason (a moving radius: any schedule, any target)
REFUSED_SETTINGS = {
    ("loss_form", "dppo"): "Tunix's GRPO loss is PPO's clipped surrogate, which the Band's bounds feed; the dppo "
                           "form is another loss",
    ("delta_schedule", "linear"): _NO_STEP,
    ("delta_schedule", "cosine"): _NO_STEP,
    ("delta_schedule", "exponential"): _NO_STEP,
    ("target_kl", "any"): _NO_STEP,
    ("anchor", "rollout"): "Tunix's TrainExample carries no rollout-engine log-probabilities",
}
#: clip-higher's default epsilon_high (DAPO), as in bandcore.rl.provider
CLIP_HIGHER_EPS = 0.28


def band_settings(config: GRPOConfig) -> BandSettings:
    """The :class:`BandSettings` of a :class:`BandGRPOConfig` (its ``band_*`` fields; Tunix's ``epsilon``,
    ``epsilon_high`` and ``epsilon_c``), after refusing what Tunix cannot run (``ValueError`` naming the field and
    the reason) and applying the on-policy rule.  The bounds are read inside a traced function: ``check=False``."""
    for field in ("loss_form", "delta_schedule", "target_kl", "anchor"):
        value = getattr(config, f"band_{field}")
        reason = REFUSED_SETTINGS.get((field, "any" if field == "target_kl" and value is not None else value))
        if reason is not None:
            raise ValueError(f"band_{field}={value!r} is not supported by the Tunix plug-in: {reason}")
    settings = BandSettings.from_host(config, prefix="band_", names=HOST_KEYS, check=False)
    settings.check_on_policy(config.num_iterations == 1,
                             f"num_iterations={config.num_iterations} (Tunix then computes no old log-probabilities; "
                             "num_iterations=2, BandGRPOConfig's default, moves it)")
    return settings


@dataclasses.dataclass(kw_only=True)
class BandGRPOConfig(GRPOConfig):
    """Tunix's ``GRPOConfig`` with the Band (module docstring); checked when built (``ValueError`` /
    ``TypeError`` naming the field).  Each ``band_<name>`` is the field ``<name>`` of :class:`BandSettings`."""

    policy_loss_fn: str = LOSS_NAME
    num_iterations: int = 2
    #: the f-divergence of the trust region (a catalogue name, ``alpha(0.5)``, a formula in u, ...)
    band_divergence: Any = "kl"
    #: its radius δ (> 0); 0.05 when no radius is given
    band_delta: float | None = None
    #: the radius of the lower / upper bound where it differs from ``band_delta``
    band_delta_low: float | None = None
    band_delta_high: float | None = None
    #: cap on the upper bound, u <= band_max_ratio (> 1)
    band_max_ratio: float | None = None
    #: "band", or "clip" / "clip-higher": Tunix's epsilon / epsilon_high, for baselines
    band_method: str = "band"
    #: "clip" ("dppo" is refused)
    band_loss_form: str = "clip"
    #: "constant" (a schedule is refused)
    band_delta_schedule: str = "constant"
    #: None (the adaptive controller is refused)
    band_target_kl: float | None = None
    #: "old" ("rollout" is refused)
    band_anchor: str = "old"
    #: accept num_iterations=1, whose ratio is always 1 (the Band then never acts)
    band_allow_on_policy: bool = False
    #: a table to read the bounds from (BandTable at δ, BandTable2D over a range holding δ, or a file path)
    band_table: Any = None
    #: Tunix's dual clip: the loss of a token with A < 0 is at most -epsilon_c A (> 1)
    epsilon_c: float | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.policy_loss_fn != LOSS_NAME:
            raise ValueError(f"policy_loss_fn must be {LOSS_NAME!r} for BandGRPOConfig, got {self.policy_loss_fn!r}")
        self.band_settings = band_settings(self)
        if self.band_table is not None and not isinstance(self.band_table, (str, Path)):
            from bandcore.tables import BandTable, BandTable2D

            if not isinstance(self.band_table, (BandTable, BandTable2D)):
                raise TypeError(f"band_table must be a BandTable, a BandTable2D or a path, got "
                                f"{type(self.band_table).__name__}")  # fmt: skip
        if self.band_settings.method == "band":
            for side in ("low", "high"):
                _table(self.band_divergence, self.radius(side), self.band_table)  # checks the table

    def radius(self, side: str) -> float:
        """δ of the ``"low"`` or ``"high"`` bound."""
        if side not in ("low", "high"):
            raise ValueError(f"side must be 'low' or 'high', got {side!r}")
        low, high = BandSettings.from_host(self, prefix="band_", names=HOST_KEYS, check=False).radii
        return low if side == "low" else high


@lru_cache(maxsize=32)
def _shipped(divergence: Any, delta: float):
    """The shipped table of ``divergence`` at ``delta`` (1-D, else the 2-D table at δ), or None."""
    from bandcore.tables import BandTable
    from bandcore.tables.shipped import SHIPPED_DELTA_RANGE, SHIPPED_DELTAS, SHIPPED_NAMES

    if divergence.name not in SHIPPED_NAMES or not divergence.is_catalogue:
        return None
    if delta in SHIPPED_DELTAS:
        return BandTable.shipped(divergence, delta)
    lo, hi = SHIPPED_DELTA_RANGE
    return BandTable.shipped(divergence, SHIPPED_DELTA_RANGE).at(delta) if lo <= delta <= hi else None


@lru_cache(maxsize=32)
def _built(divergence: Any, delta: float):
    from bandcore.tables import BandTable

    return BandTable.build(divergence, delta)


def _table(divergence: Any, delta: float, table: Any):
    """The 1-D table the bounds are read from (module docstring); ``ValueError`` naming the setting."""
    try:
        div, delta = resolve_region(divergence, delta)
    except ValueError as err:
        raise ValueError(f"band_divergence {divergence!r}: {err}") from None
    if table is None:
        return _shipped(div, delta) or _built(div, delta)
    from bandcore.tables import BandTable, BandTable2D

    if isinstance(table, (str, Path)):
        table = BandTable.load(table)
    if table.divergence.formula != div.formula:
        raise ValueError(f"band_table holds the Band of {table.divergence_name!r}, not of {div.name!r}")
    if isinstance(table, BandTable2D):
        lo, hi = table.delta_range
        if not lo <= delta <= hi:
            raise ValueError(f"band_table covers delta in [{lo:g}, {hi:g}], not delta={delta!r}")
        return table.at(delta)
    if table.delta != delta:
        raise ValueError(f"band_table is the Band at delta={table.delta!r}, not at delta={delta!r}")
    return table


@lru_cache(maxsize=32)
def _bound_functions(divergence: Any, delta_low: float, delta_high: float, table: Any):
    low = _table(divergence, delta_low, table)
    high = low if delta_high == delta_low else _table(divergence, delta_high, table)
    return low.to_jax(), high.to_jax()


def _fixed_epsilons(settings: BandSettings) -> tuple[float, float]:
    """Tunix's ``(epsilon, epsilon_high)`` of a fixed clip (``band_method`` clip / clip-higher), capped."""
    default_high = settings.clip_eps if settings.method == "clip" else CLIP_HIGHER_EPS
    high = default_high if settings.clip_eps_high is None else settings.clip_eps_high
    if settings.max_ratio is not None:
        high = min(high, settings.max_ratio - 1.0)
    return settings.clip_eps, high


def band_bounds(config: BandGRPOConfig, old_log_prob):
    """Per-token ratio bounds (lower, upper) of ``config``'s Band at ``old_log_prob`` (a jax array), capped at
    ``band_max_ratio`` (a fixed clip with ``band_method``: its constant bounds); traceable.  NaN where
    log p > 1e-6 or NaN (no error inside a traced function)."""
    settings = band_settings(config)  # (its fields may have changed since the config was built)
    if settings.method != "band":
        low, high = _fixed_epsilons(settings)
        return jnp.full_like(old_log_prob, 1.0 - low), jnp.full_like(old_log_prob, 1.0 + high)
    table = config.band_table
    key = str(table) if isinstance(table, Path) else table
    delta_low, delta_high = settings.radii
    low, high = _bound_functions(config.band_divergence, delta_low, delta_high, key)
    lower = low(old_log_prob)[0]
    upper = high(old_log_prob)[1]
    if settings.max_ratio is not None:
        upper = jnp.minimum(upper, settings.max_ratio)
    return lower, upper


@function_registry.register_policy_loss_fn(LOSS_NAME)
def band_grpo_loss_fn(model, train_example, algo_config, pad_id, eos_id, **kwargs):
    """Tunix's GRPO loss with the Band's per-token bounds (module docstring); ``algo_config`` must be a
    :class:`BandGRPOConfig`.  Returns ``(loss, aux)`` as Tunix's ``grpo_loss_fn``, ``aux`` with
    ``band/width_mean`` added.  With ``band_method`` clip / clip-higher it is Tunix's loss with its own scalar
    clip."""
    if not isinstance(algo_config, BandGRPOConfig):
        raise TypeError(f"the {LOSS_NAME!r} loss needs a BandGRPOConfig (it holds the Band's settings), got "
                        f"{type(algo_config).__name__}")  # fmt: skip
    settings = band_settings(algo_config)
    old = train_example.old_per_token_logps
    if old is None:  # on-policy: Tunix uses the current log-probabilities, the ratio is 1 and nothing clips
        loss, aux = algo_core.grpo_loss_fn(model, train_example, algo_config, pad_id, eos_id, **kwargs)
        aux["band/width_mean"] = jnp.float32(math.nan)
        return loss, aux
    mask = train_example.completion_mask
    clipped = copy.copy(algo_config)  # Tunix's clip [1 - epsilon, 1 + epsilon_high]
    if settings.method != "band":
        clipped.epsilon, clipped.epsilon_high = _fixed_epsilons(settings)
        loss, aux = algo_core.grpo_loss_fn(model, train_example, clipped, pad_id, eos_id, **kwargs)
        aux["band/width_mean"] = jnp.float32(clipped.epsilon + clipped.epsilon_high)
        return loss, aux
    old = jax.lax.stop_gradient(jnp.asarray(old, dtype=jnp.float32))
    lower, upper = band_bounds(algo_config, old)
    valid = mask > 0  # padding reads no bound (its log-probability may be anything)
    lower, upper = jnp.where(valid, lower, 1.0), jnp.where(valid, upper, 1.0)
    clipped.epsilon = 1.0 - lower  # per token: [1 - epsilon, 1 + epsilon_high] = [l, u]
    clipped.epsilon_high = upper - 1.0
    loss, aux = algo_core.grpo_loss_fn(model, train_example, clipped, pad_id, eos_id, **kwargs)
    aux["band/width_mean"] = algo_core.masked_mean(upper - lower, mask)
    return loss, aux

"""RL for language models with the Band: the policy loss (torch only), its settings and plug-ins for TRL and verl.

``import bandcore.rl`` imports nothing (not even torch); the names below are loaded on first use
(PEP 562), so ``from bandcore.rl import band_policy_loss`` imports torch and :mod:`bandcore.rl.loss` only, and
``from bandcore.rl import BandSettings`` no torch at all.

- :mod:`bandcore.rl.loss`: :func:`band_policy_loss`, :func:`per_token_policy_loss`, :func:`aggregate_loss`;
- :mod:`bandcore.rl.bounds`: :func:`log_ratio_bounds`, the per-token bounds (the Band or a fixed clip);
- :mod:`bandcore.rl.settings`: :class:`BandSettings`, every plug-in's settings (no torch), with
  :mod:`bandcore.rl.schedule` (radii that move) and :mod:`bandcore.rl.provider` (the bounds of each step);
- :mod:`bandcore.rl.trl`, :mod:`bandcore.rl.verl`: the plug-ins (each imports its framework when imported).

The small GRPO/BandPO trainer on toy tasks is an experiment, not library code: ``experiments.toy`` in a checkout.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .bounds import log_ratio_bounds
    from .loss import aggregate_loss, band_policy_loss, per_token_policy_loss
    from .settings import BandSettings

__all__ = ["BandSettings", "aggregate_loss", "band_policy_loss", "log_ratio_bounds", "per_token_policy_loss"]

_LAZY = {
    "aggregate_loss": "loss",
    "band_policy_loss": "loss",
    "per_token_policy_loss": "loss",
    "log_ratio_bounds": "bounds",
    "BandSettings": "settings",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

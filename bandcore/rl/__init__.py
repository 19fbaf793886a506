"""RL adapters for the Band: the policy loss (torch only) and plug-ins for TRL and verl.

``from bandcore.rl import band_policy_loss`` imports torch and nothing else; the plug-ins live in
:mod:`bandcore.rl.trl` and :mod:`bandcore.rl.verl` and import their framework when imported themselves.
"""

from .loss import aggregate_loss, band_policy_loss, log_ratio_bounds, per_token_policy_loss

__all__ = ["aggregate_loss", "band_policy_loss", "log_ratio_bounds", "per_token_policy_loss"]

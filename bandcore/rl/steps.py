r"""Optimizer steps for a loss that is not told them: :class:`OptimizerStepCounter`.

A schedule or the adaptive controller moves δ once per optimizer step (:class:`bandcore.rl.provider.BandBounds`).
A host that passes its loss no step count (OpenRLHF's ``PolicyLoss`` interface, verl's policy-loss protocol)
still runs every optimizer step through ``torch.optim.Optimizer.step``, whatever engine wraps it (DeepSpeed's
ZeRO optimizers and FSDP call an inner torch optimizer).  The counter registers one global post-step hook
(:func:`torch.optim.optimizer.register_optimizer_step_post_hook`) and advances its provider at the first optimizer
step after a training call of the loss (:meth:`OptimizerStepCounter.record`); several inner optimizers stepping in
one optimizer step therefore count once, and a step of an optimizer the loss was not used for (a critic's, with no
call of the policy loss since the last step) counts nothing.  The controller is told the mean :math:`r - 1 - \log r`
(the k3 estimate of :math:`KL(\pi_{old}\|\pi)`) over the tokens of the recorded calls.

The hook holds the counter weakly, and is removed when the counter is collected.  The count is per process and
starts at 0 (a run resumed from a checkpoint restarts its schedule).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from .provider import BandBounds

__all__ = ["OptimizerStepCounter"]


def _on_step(counter_ref: weakref.ref, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
    counter = counter_ref()
    if counter is not None:
        counter.optimizer_stepped()


class OptimizerStepCounter:
    """Advances ``provider`` once per optimizer step that follows a recorded training call (module docstring)."""

    def __init__(self, provider: BandBounds) -> None:
        if not isinstance(provider, BandBounds):
            raise TypeError(f"provider must be a BandBounds, got {type(provider).__name__}")
        self.provider = provider
        self._totals: torch.Tensor | None = None  # (k3 sum, token count) since the last optimizer step
        ref = weakref.ref(self)
        handle = register_optimizer_step_post_hook(lambda *args: _on_step(ref, *args))
        weakref.finalize(self, handle.remove)

    def record(self, log_prob: torch.Tensor, old_log_prob: torch.Tensor, mask: torch.Tensor) -> None:
        """Note a training call: the next optimizer step advances the provider; its k3 KL goes to the controller
        (no host synchronisation here)."""
        with torch.no_grad():
            log_ratio = log_prob.detach() - old_log_prob.detach()
            counted = (mask != 0) & torch.isfinite(log_ratio)
            k3 = torch.where(counted, torch.expm1(log_ratio) - log_ratio, 0.0)
            totals = torch.stack([k3.sum().to(torch.float64), counted.sum().to(torch.float64)])
        self._totals = totals if self._totals is None else self._totals + totals

    def optimizer_stepped(self) -> None:
        """An optimizer step: advance if the loss was used since the last one (one host synchronisation)."""
        if self._totals is None:
            return
        kl_sum, tokens = self._totals.tolist()
        self._totals = None
        if tokens > 0:
            self.provider.record_kl(kl_sum / tokens)
        self.provider.advance()

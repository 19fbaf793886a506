"""bandcore.rl.steps.OptimizerStepCounter: optimizer steps counted for a loss that is not told them."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch

from bandcore.rl.settings import BandSettings
from bandcore.rl.steps import OptimizerStepCounter


def _policy_step(counter: OptimizerStepCounter | None, optimizer, weight, record: bool = True) -> None:
    log_prob = torch.log_softmax(weight, -1)[None, :3]
    if record and counter is not None:
        counter.record(log_prob, torch.full_like(log_prob, math.log(0.2)), torch.ones_like(log_prob, dtype=torch.bool))
    (-log_prob.sum()).backward()
    optimizer.step()
    optimizer.zero_grad()


def test_counts_optimizer_steps_after_a_recorded_call_once():
    settings = BandSettings(delta=0.05, delta_schedule="linear", delta_end=0.01, delta_steps=4)
    provider = settings.bounds_provider()
    counter = OptimizerStepCounter(provider)
    weight = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    optimizer, other = torch.optim.SGD([weight], lr=0.1), torch.optim.Adam([torch.zeros(2, requires_grad=True)])
    _policy_step(counter, optimizer, weight)
    assert provider.step == 1 and provider.delta == 0.04
    other.step()  # another optimizer with no recorded call since: not counted
    _policy_step(counter, optimizer, weight, record=False)  # a step without a call of the loss: not counted
    assert provider.step == 1
    _policy_step(counter, optimizer, weight)
    assert provider.step == 2


def test_tells_the_controller_the_k3_kl_of_the_recorded_tokens():
    settings = BandSettings(delta=0.05, target_kl=1e-3)
    provider = settings.bounds_provider()
    counter = OptimizerStepCounter(provider)
    log_prob = torch.log(torch.tensor([[0.3, 0.5]], dtype=torch.float64))
    old = torch.log(torch.tensor([[0.2, 0.5]], dtype=torch.float64))
    counter.record(log_prob, old, torch.tensor([[True, True]]))
    counter.optimizer_stepped()
    r = 1.5  # k3 = r - 1 - log r on the first token, 0 on the second: the mean is far above the target
    assert (r - 1 - math.log(r)) / 2 > 1e-3 and provider.delta == pytest.approx(0.05 * math.exp(-0.1), rel=5e-3)


def test_the_global_hook_does_not_keep_the_counter_alive():
    provider = BandSettings(delta=0.05, delta_schedule="linear", delta_end=0.01, delta_steps=4).bounds_provider()
    counter = OptimizerStepCounter(provider)
    alive = weakref.ref(counter)
    del counter
    gc.collect()
    assert alive() is None
    weight = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    _policy_step(None, torch.optim.SGD([weight], lr=0.1), weight)  # steps after it is gone: nothing to advance
    assert provider.step == 0


def test_needs_a_provider():
    with pytest.raises(TypeError, match="provider must be a BandBounds"):
        OptimizerStepCounter(BandSettings())

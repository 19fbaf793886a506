"""The verl plug-in on the adapter contract, and its radii that move, its anchor and its step count."""

from __future__ import annotations

import inspect
import math
from typing import ClassVar

import pytest
import torch
import verl.trainer.ppo.core_algos as core_algos
from adapter_contract import CHECKS, Run
from verl.workers.config import ActorConfig, PolicyLossConfig

from bandcore.rl import band_policy_loss
from bandcore.rl import verl as plugin
from bandcore.rl.schedule import used_delta
from bandcore.rl.settings import BandSettings
from bandcore.rl.verl import BandPolicyLossConfig

B, T = 12, 24
CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}


@pytest.fixture(autouse=True)
def fresh_step_state():
    plugin.reset_step_state()
    yield
    plugin.reset_step_state()


def _actor(policy_loss, **overrides) -> ActorConfig:
    return ActorConfig(**{"strategy": "fsdp", "rollout_n": 2, "ppo_micro_batch_size_per_gpu": 2,
                          "policy_loss": policy_loss, **CLIP, **overrides})


def _band_config(**settings) -> BandPolicyLossConfig:
    return BandPolicyLossConfig(**{f"band_{k}": v for k, v in settings.items()})


class VerlDriver:
    keys: ClassVar[dict[str, str]] = {name: f"band_{name}" for name in BandSettings.__dataclass_fields__}
    metric_names = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower", "actor/band_clipfrac_high",
                    "actor/band_clipfrac_low", "actor/band_width", "actor/pg_clipfrac_fixed")
    delta_metrics = ("actor/band_delta", "actor/band_delta_low", "actor/band_delta_high")
    shared_metrics = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
    rtol = 1e-13

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(8)
        self.old = -torch.empty(B, T, dtype=torch.float64).uniform_(0.01, 6.0, generator=gen)
        moved = self.old + 0.7 * torch.randn(B, T, generator=gen, dtype=torch.float64)
        self.leaf = torch.where(moved > 0, -moved, moved).requires_grad_()
        self.adv = torch.randn(B, 1, generator=gen, dtype=torch.float64).expand(B, T).contiguous()
        self.mask = torch.arange(T)[None, :] < torch.randint(4, T + 1, (B,), generator=gen)[:, None]

    def batch(self):
        return self.old, self.adv, self.mask

    def log_prob(self):
        return self.leaf * 1.0

    def _run(self, config) -> Run:
        loss, metrics = core_algos.get_policy_loss_fn(config.policy_loss.loss_mode)(
            self.old, self.leaf, self.adv, self.mask, "token-mean", config)
        return Run(loss, [self.leaf], metrics)

    def plugin(self, **settings) -> Run:
        return self._run(_actor(_band_config(**settings)))

    def host(self) -> Run:
        return self._run(_actor(PolicyLossConfig(loss_mode="vanilla")))

    def reference_kwargs(self, **settings):
        form = settings.get("loss_form", "clip")
        return {"loss_agg_mode": "token-mean", **({"clip_ratio_c": 3.0} if form == "dppo" else {"dual_clip": 3.0})}

    def build(self, **settings) -> None:
        _band_config(**settings)


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_the_verl_plugin_keeps_the_adapter_contract(check):
    check(VerlDriver())


# ---------------------------------------------------------------------------------------------------------
# Radii that move: the plug-in counts optimizer steps with a torch.optim post-step hook
# ---------------------------------------------------------------------------------------------------------


class TinyPolicy(torch.nn.Module):
    """A linear softmax policy over 5 tokens: log-probabilities of fixed sampled tokens, with a gradient."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(3, 5, dtype=torch.float64)
        self.x = torch.randn(B, T, 3, dtype=torch.float64)
        self.tokens = torch.randint(0, 5, (B, T))

    def forward(self) -> torch.Tensor:
        return torch.log_softmax(self.linear(self.x), -1).gather(-1, self.tokens[..., None])[..., 0]


def _train(config, steps: int, micro_batches: int = 1, lr: float = 0.5):
    """A small PPO update: each optimizer step takes ``micro_batches`` loss calls; returns each call's metrics."""
    policy = TinyPolicy()
    optimizer = torch.optim.SGD(policy.parameters(), lr=lr)
    with torch.no_grad():
        old = policy()
    adv = torch.randn(B, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).expand(B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    logged = []
    for _ in range(steps):
        for _ in range(micro_batches):
            loss, metrics = core_algos.get_policy_loss_fn("bandpo")(old, policy(), adv, mask, "token-mean", config)
            (loss / micro_batches).backward()
            logged.append(metrics)
        optimizer.step()
        optimizer.zero_grad()
    return logged


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_a_schedule_follows_the_optimizer_steps(micro_batches):
    config = _actor(_band_config(delta=0.05, delta_schedule="linear", delta_end=0.01, delta_steps=4,
                                 delta_hold_steps=1))
    logged = _train(config, steps=7, micro_batches=micro_batches)
    deltas = [m["actor/band_delta"] for m in logged[::micro_batches]]
    assert deltas == [0.05, 0.05, 0.04, 0.03, 0.02, 0.01, 0.01]
    assert all(m["actor/band_delta"] == d for m, d in zip(logged, [d for d in deltas for _ in range(micro_batches)],
                                                          strict=True))


def test_steps_without_a_training_call_of_the_loss_do_not_count():
    config = _actor(_band_config(delta=0.05, delta_schedule="exponential", delta_end=0.0125, delta_steps=2))
    loss_fn = core_algos.get_policy_loss_fn("bandpo")
    policy = TinyPolicy()
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)  # e.g. a critic in the same process
    with torch.no_grad():
        old = policy()
        adv, mask = torch.ones(B, T, dtype=torch.float64), torch.ones(B, T, dtype=torch.bool)
        _, first = loss_fn(old, policy(), adv, mask, "token-mean", config)  # evaluation: no gradient
    other.step()
    _, second = loss_fn(old, policy(), adv, mask, "token-mean", config)
    assert first["actor/band_delta"] == second["actor/band_delta"] == 0.05
    other.step()  # a training call happened: this step counts (the plug-in cannot tell optimizers apart)
    other.step()  # ... but only once
    _, third = loss_fn(old, policy(), adv, mask, "token-mean", config)
    assert third["actor/band_delta"] == used_delta(0.05 * 0.25**0.5)


def test_the_controller_moves_delta_after_each_step_by_its_rule():
    target = 1e-4
    config = _actor(_band_config(delta=0.05, target_kl=target, kl_rate=0.5))
    policy = TinyPolicy()
    optimizer = torch.optim.SGD(policy.parameters(), lr=2.0)
    with torch.no_grad():
        old = policy()
    adv = torch.linspace(-1, 1, B, dtype=torch.float64)[:, None].expand(B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    expected = 0.05
    for step in range(5):
        log_prob = policy()
        loss, metrics = core_algos.get_policy_loss_fn("bandpo")(old, log_prob, adv, mask, "token-mean", config)
        assert metrics["actor/band_delta"] == used_delta(expected), step
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            log_ratio = log_prob - old
            kl = float((torch.expm1(log_ratio) - log_ratio).mean())
        if kl > 0:  # step 0 is on-policy: KL exactly 0, delta stays
            expected = min(0.2, max(0.01, expected * math.exp(-0.5 * max(-1.0, min(1.0, math.log(kl / target))))))
        else:
            assert step == 0
    assert used_delta(expected) != 0.05  # it moved


# ---------------------------------------------------------------------------------------------------------
# The anchor
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_form", ["clip", "dppo"])
def test_rollout_anchor_takes_rollout_log_probs(loss_form):
    driver = VerlDriver()
    rollout = torch.clamp(driver.old + 0.2 * torch.randn(B, T, dtype=torch.float64,
                                                         generator=torch.Generator().manual_seed(3)), max=0.0)
    config = _actor(_band_config(anchor="rollout", loss_form=loss_form))
    loss, metrics = plugin.compute_policy_loss_bandpo(driver.old, driver.leaf, driver.adv, driver.mask, "token-mean",
                                                      config, rollout_log_probs=rollout)
    kwargs = driver.reference_kwargs(loss_form=loss_form)
    want, ours = band_policy_loss(driver.log_prob(), driver.old, driver.adv, driver.mask, anchor_log_prob=rollout,
                                  loss_form=loss_form, **kwargs)
    torch.testing.assert_close(loss, want, rtol=1e-14, atol=0)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(ours["clipfrac"]), rel=1e-12)
    unanchored, _ = band_policy_loss(driver.log_prob(), driver.old, driver.adv, driver.mask, loss_form=loss_form,
                                     **kwargs)
    assert not torch.allclose(want, unanchored)


def test_rollout_anchor_without_rollout_log_probs_names_the_key():
    driver = VerlDriver()
    config = _actor(_band_config(anchor="rollout"))
    with pytest.raises(ValueError, match=r"band_anchor='rollout' needs .* as rollout_log_probs"):
        core_algos.get_policy_loss_fn("bandpo")(driver.old, driver.leaf, driver.adv, driver.mask, "token-mean",
                                                config)


def test_what_verl_passes_a_policy_loss_is_what_the_docs_say():
    """The plug-in documents that verl 0.9.1's actor loss passes no rollout log-probabilities and no step: this
    fails when verl starts passing them, so that the plug-in can use them."""
    from verl.workers.utils import losses

    source = inspect.getsource(losses.ppo_loss)
    call = source[source.index("pg_loss, pg_metrics = policy_loss_fn("):]
    call = call[:call.index(")") + 1]
    assert "rollout_is_weights=rollout_is_weights" in call and "rollout_log_probs" not in call, call
    keys = set(__import__("re").findall(r'config\.global_batch_info\["(\w+)"\]', source))
    assert keys == {"dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor"}, keys


def test_one_sided_radii_through_verl_keys():
    driver = VerlDriver()
    run = driver.plugin(delta_low=0.02, delta_high=0.1, loss_form="dppo")
    want, _ = band_policy_loss(driver.log_prob(), driver.old, driver.adv, driver.mask, delta_low=0.02,
                               delta_high=0.1, loss_form="dppo", clip_ratio_c=3.0)
    torch.testing.assert_close(run.loss, want, rtol=1e-14, atol=0)
    assert (run.metrics["actor/band_delta_low"], run.metrics["actor/band_delta_high"]) == (0.02, 0.1)

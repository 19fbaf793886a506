"""The Band's dppo form is DPPO: with ``kl`` and ``tv`` it equals verl 0.9.1's own ``dppo_kl`` / ``dppo_tv``.

verl's DPPO-Binary-KL keeps a token with A > 0 when the binary KL of (p_old, p) is at most ``clip_ratio_high`` or
p <= p_old, and one with A <= 0 when it is at most ``clip_ratio_low`` or p >= p_old; DPPO-Binary-TV the same with
p - p_old.  The binary KL is g_f(p_old, r) of bandcore's ``kl`` (KL(pi_old || pi)) and p - p_old is g_f of ``tv``,
so the kept set is r <= u(p_old, delta_high) for A > 0 and r >= l(p_old, delta_low) for A <= 0: the Band's.  Both
are compared on 32,768 random tokens, loss and per-token gradient, through ``band_policy_loss`` and through the
verl plug-in (``bandpo`` with ``band_loss_form="dppo"``); tokens whose log-ratio lies within 1e-6 of a bound may
differ (verl adds 1e-8 inside its logarithms and compares in its own rounding), every other token must agree.
"""

from __future__ import annotations

import pytest
import torch
import verl.trainer.ppo.core_algos as core_algos
from verl.workers.config import ActorConfig, PolicyLossConfig

from bandcore.rl import band_policy_loss, log_ratio_bounds
from bandcore.rl.verl import BandPolicyLossConfig

B, T = 136, 256  # 34,816 positions, about 33,000 of them response tokens
NEAR = 1e-6
RADII = [(0.05, 0.05), (0.03, 0.08), (0.08, 0.02)]


@pytest.fixture(scope="module")
def tokens():
    gen = torch.Generator().manual_seed(2026)
    f64 = torch.float64
    likely = torch.rand(B, T, generator=gen, dtype=f64) < 0.5
    old = torch.where(likely, -torch.empty(B, T, dtype=f64).uniform_(1e-4, 0.3, generator=gen),
                      -torch.empty(B, T, dtype=f64).uniform_(0.3, 9.0, generator=gen))
    moved = old + 0.6 * torch.randn(B, T, generator=gen, dtype=f64)
    log_prob = torch.where(moved > 0, -moved, moved)  # reflected into log p <= 0
    advantages = torch.randn(B, 1, generator=gen, dtype=f64).expand(B, T).contiguous()
    advantages[::9] = 0.0  # groups whose rewards were all equal
    lengths = torch.randint(T - 24, T + 1, (B,), generator=gen)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return old, log_prob, advantages, mask


def _verl(name: str, low: float, high: float, **overrides) -> ActorConfig:
    kwargs = dict(strategy="fsdp", rollout_n=2, ppo_micro_batch_size_per_gpu=2, clip_ratio=0.2, clip_ratio_low=low,
                  clip_ratio_high=high, clip_ratio_c=20.0, policy_loss=PolicyLossConfig(loss_mode=name))
    return ActorConfig(**{**kwargs, **overrides})


def _loss_and_grad(function, log_prob):
    x = log_prob.clone().requires_grad_()
    loss, metrics = function(x)
    return loss.detach(), torch.autograd.grad(loss, x)[0], metrics


def _near_a_bound(old, log_prob, divergence, low, high):
    lower, upper = log_ratio_bounds(old, divergence=divergence, delta_low=low, delta_high=high)
    log_ratio = log_prob - old
    return ((log_ratio - lower).abs() <= NEAR) | ((log_ratio - upper).abs() <= NEAR)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize(("low", "high"), RADII)
@pytest.mark.parametrize("divergence", ["kl", "tv"])
def test_dppo_form_equals_verls_dppo(tokens, divergence, low, high, mode):
    old, log_prob, adv, mask = tokens
    verl_loss = core_algos.get_policy_loss_fn(f"dppo_{divergence}")
    config = _verl(f"dppo_{divergence}", low, high)
    plugin_config = _verl("bandpo", low, high, policy_loss=BandPolicyLossConfig(
        band_divergence=divergence, band_delta_low=low, band_delta_high=high, band_loss_form="dppo"))
    near = _near_a_bound(old, log_prob, divergence, low, high) & mask
    runs = {
        "verl": lambda x, m=mask: verl_loss(old, x, adv, m, mode, config),
        "band_policy_loss": lambda x, m=mask: band_policy_loss(
            x, old, adv, m, divergence=divergence, delta_low=low, delta_high=high, loss_form="dppo",
            clip_ratio_c=20.0, loss_agg_mode=mode),
        "plugin": lambda x, m=mask: core_algos.get_policy_loss_fn("bandpo")(old, x, adv, m, mode, plugin_config),
    }
    results = {name: _loss_and_grad(run, log_prob) for name, run in runs.items()}
    theirs_grad = results["verl"][1]
    for name in ("band_policy_loss", "plugin"):
        grad = results[name][1]
        differs = grad != theirs_grad
        assert not (differs & ~near).any(), (
            f"{name}: {int((differs & ~near).sum())} token(s) farther than {NEAR:g} from a bound have another "
            f"gradient than verl's dppo_{divergence}")
        # the loss over the tokens away from the bounds: the same, to the rounding of the aggregation
        away = mask & ~near
        ours = _loss_and_grad(lambda x, r=runs[name], m=away: r(x, m), log_prob)[0]
        theirs = _loss_and_grad(lambda x, m=away: runs["verl"](x, m), log_prob)[0]
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)
    # the comparison bites: many tokens dropped on both sides, some kept with r > C, near-bound tokens are few
    metrics = results["band_policy_loss"][2]
    assert float(metrics["clipfrac_high"]) > 0.02 and float(metrics["clipfrac_low"]) > 0.02
    assert int(near.sum()) < 0.01 * int(mask.sum())
    assert results["plugin"][2]["actor/pg_clipfrac"] == pytest.approx(float(metrics["clipfrac"]), rel=1e-12)


def test_the_plugin_reads_verls_clip_ratio_c_as_the_truncation(tokens):
    """clip_ratio_c is DPPO's C in both: at C = 1.5 many kept tokens are truncated, and the two still agree."""
    old, log_prob, adv, mask = tokens
    config = _verl("dppo_kl", 0.05, 0.05, clip_ratio_c=1.5)
    plugin_config = _verl("bandpo", 0.05, 0.05, clip_ratio_c=1.5, policy_loss=BandPolicyLossConfig(
        band_divergence="kl", band_delta=0.05, band_loss_form="dppo"))
    near = _near_a_bound(old, log_prob, "kl", 0.05, 0.05) & mask
    away = mask & ~near
    theirs = _loss_and_grad(lambda x: core_algos.get_policy_loss_fn("dppo_kl")(old, x, adv, away, "token-mean",
                                                                              config), log_prob)
    ours = _loss_and_grad(lambda x: core_algos.get_policy_loss_fn("bandpo")(old, x, adv, away, "token-mean",
                                                                           plugin_config), log_prob)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-12, atol=0)
    assert torch.equal(ours[1], theirs[1])
    # verl's metric is a float32 mean
    assert ours[2]["actor/pg_clipfrac_lower"] == pytest.approx(theirs[2]["actor/pg_clipfrac_lower"], rel=1e-6)
    assert theirs[2]["actor/pg_clipfrac_lower"] > 0.01


@pytest.mark.parametrize("divergence", ["kl", "tv"])
def test_dppo_form_equals_verls_dppo_in_float32(tokens, divergence):
    """verl trains with fp32 log-probabilities: the plug-in computes in fp32 too, with the same kept tokens."""
    old, log_prob, adv, mask = (t.float() if t.is_floating_point() else t for t in tokens)
    config = _verl(f"dppo_{divergence}", 0.03, 0.08)
    plugin_config = _verl("bandpo", 0.03, 0.08, policy_loss=BandPolicyLossConfig(
        band_divergence=divergence, band_delta_low=0.03, band_delta_high=0.08, band_loss_form="dppo"))
    near = _near_a_bound(tokens[0], tokens[1], divergence, 0.03, 0.08) & mask
    theirs = _loss_and_grad(lambda x: core_algos.get_policy_loss_fn(f"dppo_{divergence}")(
        old, x, adv, mask, "token-mean", config), log_prob)
    ours = _loss_and_grad(lambda x: core_algos.get_policy_loss_fn("bandpo")(
        old, x, adv, mask, "token-mean", plugin_config), log_prob)
    assert ours[1].dtype == theirs[1].dtype == torch.float32
    assert not ((ours[1] != theirs[1]) & ~near).any()
    if not near.any():
        assert torch.equal(ours[0], theirs[0])

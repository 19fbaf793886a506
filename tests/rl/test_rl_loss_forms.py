"""band_policy_loss beyond PPO clip: asymmetric radii, the dppo form, the anchor, and their bad input."""

from __future__ import annotations

import math

import pytest
import torch

from bandcore import band_log
from bandcore.rl import band_policy_loss, log_ratio_bounds

F64 = torch.float64


@pytest.fixture(scope="module")
def batch():
    gen = torch.Generator().manual_seed(17)
    old = -torch.empty(6, 40, dtype=F64).uniform_(0.001, 7.0, generator=gen)
    moved = old + 0.7 * torch.randn(6, 40, generator=gen, dtype=F64)
    log_prob = torch.where(moved > 0, -moved, moved)
    adv = torch.tensor([1.0, -1.0, 0.5, -2.0, 0.0, 1.5], dtype=F64)
    mask = torch.ones(6, 40, dtype=torch.bool)
    mask[2, 30:] = False
    return log_prob, old, adv, mask


def _grad(loss_fn, log_prob):
    x = log_prob.clone().requires_grad_()
    loss, metrics = loss_fn(x)
    return loss.detach(), torch.autograd.grad(loss, x)[0], metrics


# ---------------------------------------------------------------------------------------------------------
# Asymmetric radii: the lower bound of one Band, the upper of another
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("divergence", ["kl", "tv", "hellinger", "renyi(2)", "(u-1)**4"])
def test_one_sided_radii_are_the_two_one_sided_bands(batch, divergence):
    _, old, _, _ = batch
    lower, upper = log_ratio_bounds(old, divergence=divergence, delta_low=0.02, delta_high=0.11)
    assert torch.equal(lower, band_log(old, divergence, 0.02)[0])
    assert torch.equal(upper, band_log(old, divergence, 0.11)[1])
    only_low = log_ratio_bounds(old, divergence=divergence, delta_low=0.02)  # the other side takes 0.05
    assert torch.equal(only_low[1], band_log(old, divergence, 0.05)[1])


@pytest.mark.parametrize("loss_form", ["clip", "dppo"])
def test_loss_with_one_sided_radii_is_the_loss_at_those_bounds(batch, loss_form):
    log_prob, old, adv, mask = batch
    bounds = (band_log(old, "kl", 0.02)[0], band_log(old, "kl", 0.11)[1])
    kwargs = dict(loss_form=loss_form, loss_agg_mode="seq-mean-token-mean")
    got = _grad(lambda x: band_policy_loss(x, old, adv, mask, delta_low=0.02, delta_high=0.11, **kwargs), log_prob)
    want = _grad(lambda x: band_policy_loss(x, old, adv, mask, log_bounds=bounds, **kwargs), log_prob)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    symmetric = _grad(lambda x: band_policy_loss(x, old, adv, mask, delta=0.05, **kwargs), log_prob)
    assert not torch.equal(got[1], symmetric[1])  # the radii matter on this batch
    assert torch.equal(symmetric[0], _grad(lambda x: band_policy_loss(x, old, adv, mask, **kwargs), log_prob)[0])


# ---------------------------------------------------------------------------------------------------------
# The dppo form, by hand
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_ratio", [None, 1.3])
def test_dppo_form_by_hand(batch, max_ratio):
    log_prob, old, adv, mask = batch
    c = 2.5
    lower, upper = log_ratio_bounds(old, divergence="js", delta=0.07, max_ratio=max_ratio)
    log_ratio = log_prob - old
    a = adv[:, None].expand_as(log_prob)
    keep = torch.where(a > 0, (log_ratio <= upper) | (log_ratio <= 0), (log_ratio >= lower) | (log_ratio >= 0))
    weight = torch.clamp(torch.exp(log_ratio), max=c)
    n = mask.sum()
    expected_loss = (-a * weight * log_prob * keep * mask).sum() / n
    expected_grad = -a * weight * keep * mask / n
    loss, grad, metrics = _grad(lambda x: band_policy_loss(x, old, adv, mask, divergence="js", delta=0.07,
                                                           max_ratio=max_ratio, loss_form="dppo",
                                                           clip_ratio_c=c), log_prob)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-14, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-14, atol=0)
    dropped_high = (a > 0) & ~keep & mask
    dropped_low = (a < 0) & ~keep & mask
    assert float(metrics["clipfrac_high"]) == pytest.approx(float(dropped_high.sum() / n))
    assert float(metrics["clipfrac_low"]) == pytest.approx(float(dropped_low.sum() / n))
    truncated = keep & mask & (torch.exp(log_ratio) > c)
    assert float(metrics["truncfrac"]) == pytest.approx(float(truncated.sum() / n))
    assert dropped_high.any() and dropped_low.any() and truncated.any()  # every branch is exercised
    assert "dual_clipfrac" not in metrics


def test_dppo_form_keeps_the_clip_forms_gradient_zero_set(batch):
    """The trust region drops the same tokens in both forms; the kept ones differ only by the weight r vs min(r, C)."""
    log_prob, old, adv, mask = batch
    clip = _grad(lambda x: band_policy_loss(x, old, adv, mask), log_prob)[1]
    dppo = _grad(lambda x: band_policy_loss(x, old, adv, mask, loss_form="dppo", clip_ratio_c=1e6), log_prob)[1]
    nonzero_a = (adv[:, None] != 0).expand_as(mask) & mask
    assert torch.equal((clip != 0) & nonzero_a, (dppo != 0) & nonzero_a)
    torch.testing.assert_close(clip, dppo, rtol=1e-14, atol=0)  # C never reached: -A r grad(log pi) in both


def test_dppo_form_drops_impossible_tokens_and_ignores_padding(batch):
    log_prob, old, adv, mask = batch
    old = old.clone()
    old[0, 3] = -math.inf
    padded = torch.where(mask, log_prob, torch.nan)
    loss, grad, _ = _grad(lambda x: band_policy_loss(x, torch.where(mask, old, torch.nan), adv, mask,
                                                     loss_form="dppo"), padded)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert grad[0, 3] == 0 and (grad[~mask] == 0).all()


# ---------------------------------------------------------------------------------------------------------
# The anchor: the Band of another policy's probability, bounding pi / pi_anchor
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_form", ["clip", "dppo"])
def test_anchor_on_the_old_policy_changes_nothing(batch, loss_form):
    log_prob, old, adv, mask = batch
    plain = _grad(lambda x: band_policy_loss(x, old, adv, mask, loss_form=loss_form), log_prob)
    anchored = _grad(lambda x: band_policy_loss(x, old, adv, mask, loss_form=loss_form, anchor_log_prob=old),
                     log_prob)
    assert torch.equal(plain[0], anchored[0]) and torch.equal(plain[1], anchored[1])
    assert all(torch.equal(plain[2][k], anchored[2][k]) for k in plain[2])


@pytest.mark.parametrize("loss_form", ["clip", "dppo"])
def test_anchor_bounds_the_ratio_to_the_anchor(batch, loss_form):
    """With the rollout's log-probabilities a: the Band of p_a bounds pi / pi_a, i.e. r = pi / p within
    [l(p_a) pi_a / p, u(p_a) pi_a / p]; the importance ratio (and the dppo weight) stays pi / p."""
    log_prob, old, adv, mask = batch
    gen = torch.Generator().manual_seed(4)
    anchor = torch.clamp(old + 0.3 * torch.randn(old.shape, generator=gen, dtype=F64), max=0.0)
    lower, upper = log_ratio_bounds(anchor, divergence="kl", delta=0.05)
    shifted = (lower + anchor - old, upper + anchor - old)
    got = _grad(lambda x: band_policy_loss(x, old, adv, mask, loss_form=loss_form, anchor_log_prob=anchor),
                log_prob)
    if loss_form == "clip":
        want = _grad(lambda x: band_policy_loss(x, old, adv, mask, log_bounds=shifted), log_prob)
        torch.testing.assert_close(got[0], want[0], rtol=1e-14, atol=0)
        torch.testing.assert_close(got[1], want[1], rtol=1e-14, atol=0)
    else:  # kept: inside the anchor's Band, or moving back toward pi_a
        log_ratio = log_prob - old
        a = adv[:, None].expand_as(log_prob)
        back_up, back_down = log_prob <= anchor, log_prob >= anchor
        keep = torch.where(a > 0, (log_ratio <= shifted[1]) | back_up, (log_ratio >= shifted[0]) | back_down)
        expected = -a * torch.clamp(torch.exp(log_ratio), max=20.0) * keep * mask / mask.sum()
        torch.testing.assert_close(got[1], expected, rtol=1e-14, atol=0)
    plain = _grad(lambda x: band_policy_loss(x, old, adv, mask, loss_form=loss_form), log_prob)
    assert not torch.equal(got[1], plain[1])


def test_an_impossible_anchor_token_is_dropped(batch):
    log_prob, old, adv, mask = batch
    anchor = old.clone()
    anchor[1, 5] = -math.inf
    grad = _grad(lambda x: band_policy_loss(x, old, adv, mask, anchor_log_prob=anchor), log_prob)[1]
    assert grad[1, 5] == 0 and torch.isfinite(grad).all()


# ---------------------------------------------------------------------------------------------------------
# Bad input, named
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"loss_form": "cispo"}, ValueError, r"loss_form must be one of \('clip', 'dppo'\), got 'cispo'"),
        ({"clip_ratio_c": 10.0}, ValueError, "clip_ratio_c=10.0 is the truncation of loss_form='dppo'"),
        ({"loss_form": "dppo", "clip_ratio_c": 1.0}, ValueError, "clip_ratio_c must be a finite number > 1"),
        ({"loss_form": "dppo", "dual_clip": 3.0}, ValueError, "dual_clip=3.0 applies to loss_form='clip'"),
        ({"delta_low": 0.0}, ValueError, "delta_low must be a finite number > 0, got 0.0"),
        ({"delta_high": -1.0}, ValueError, "delta_high must be a finite number > 0, got -1.0"),
        ({"delta_high": "0.1"}, TypeError, "delta_high must be a real number, got '0.1'"),
        ({"delta": 0.05, "delta_low": 0.03}, ValueError,
         "delta=0.05 sets both radii but delta_low=0.03 differs: give either delta or delta_low / delta_high"),
        ({"delta_high": 2e3}, ValueError, "delta_high must be finite with 0 < delta_high <= 1000"),
    ],
)
def test_bad_loss_settings_are_named(batch, kwargs, error, match):
    with pytest.raises(error, match=match):
        band_policy_loss(*batch, **kwargs)


def test_consistent_radii_are_accepted(batch):
    a = band_policy_loss(*batch, delta=0.05, delta_low=0.05, delta_high=0.05)[0]
    assert torch.equal(a, band_policy_loss(*batch)[0])


def test_bad_anchor_tensors_are_named(batch):
    log_prob, old, adv, mask = batch
    with pytest.raises(ValueError, match=r"anchor_log_prob must have the shape of log_prob \(6, 40\), got \(6, 39\)"):
        band_policy_loss(log_prob, old, adv, mask, anchor_log_prob=old[:, :39])
    with pytest.raises(TypeError, match="anchor_log_prob must be a floating-point tensor"):
        band_policy_loss(log_prob, old, adv, mask, anchor_log_prob=old.long())
    bad = old.clone()
    bad[0, 0] = 0.5
    with pytest.raises(ValueError, match=r"anchor_log_prob must be <= 0 at unmasked tokens .* anchor_log_prob=0\.5"):
        band_policy_loss(log_prob, old, adv, mask, anchor_log_prob=bad)
    nan = old.clone()
    nan[0, 0] = math.nan
    loss, _ = band_policy_loss(log_prob, old, adv, mask, anchor_log_prob=nan)
    assert torch.isnan(loss)  # NaN never silently becomes a bound

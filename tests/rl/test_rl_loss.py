"""The Band policy loss against a hand-written reference (ratio space, oracle bounds) and its gradient."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bandcore.oracle import reference_band_log
from bandcore.rl import aggregate_loss, band_policy_loss, log_ratio_bounds, per_token_policy_loss
from bandcore.rl.loss import LOSS_AGG_MODES

B, T = 4, 6
DELTA = 0.05


# ---------------------------------------------------------------------------------------------------------
# The reference: the obvious formulas, in ratio space, with bounds from the 50-digit oracle
# ---------------------------------------------------------------------------------------------------------


def reference_bounds(old_log_prob: torch.Tensor, method: str, divergence="kl", delta=DELTA, max_ratio=None,
                     clip_eps=0.2, clip_eps_high=None):
    if method == "band":
        lo, up = reference_band_log(divergence, old_log_prob.numpy(), delta)
        lower, upper = torch.from_numpy(np.exp(lo)), torch.from_numpy(np.exp(up))
    else:
        high = clip_eps_high if clip_eps_high is not None else (clip_eps if method == "clip" else 0.28)
        lower = torch.full_like(old_log_prob, 1 - clip_eps)
        upper = torch.full_like(old_log_prob, 1 + high)
    if max_ratio is not None:
        upper = torch.clamp(upper, max=max_ratio)
    return lower, upper


def reference_loss(log_prob, old_log_prob, advantages, mask, lower, upper, mode, dual_clip=None):
    adv = advantages.reshape(B, -1).expand(B, T)
    ratio = torch.exp(log_prob - old_log_prob)
    clipped = torch.minimum(torch.maximum(ratio, lower), upper)
    pg = torch.maximum(-adv * ratio, -adv * clipped)
    if dual_clip is not None:
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * dual_clip), pg)
    m = mask.to(pg.dtype)
    pg = torch.where(mask.bool(), pg, 0.0)
    lengths = m.sum(1)
    rows = lengths > 0
    seq_sum = (pg * m).sum(1)[rows]
    if mode == "token-mean":
        return (pg * m).sum() / m.sum()
    if mode == "token-sum":
        return (pg * m).sum()
    if mode == "seq-mean-token-mean":
        return (seq_sum / lengths[rows]).mean()
    if mode == "seq-mean-token-sum":
        return seq_sum.mean()
    assert mode == "seq-mean-token-sum-norm"
    return seq_sum.mean() / T


@pytest.fixture(scope="module")
def batch():
    """fp64 batch with padding (an empty row too), mixed-sign advantages, ratios that leave every band."""
    gen = torch.Generator().manual_seed(0)
    old = torch.empty(B, T, dtype=torch.float64).uniform_(-6.0, -0.01, generator=gen)  # p in [0.0025, 0.99]
    log_prob = old + 0.7 * torch.randn(B, T, dtype=torch.float64, generator=gen)
    advantages = torch.tensor([1.0, -0.7, 0.4, -1.3], dtype=torch.float64)
    lengths = torch.tensor([6, 4, 2, 0])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return log_prob, old, advantages, mask


@pytest.fixture(scope="module")
def band_bounds(batch):
    return reference_bounds(batch[1], "band")


def _bounds(batch, band_bounds, method, max_ratio=None):
    if method == "band":
        lower, upper = band_bounds
        return lower, (upper if max_ratio is None else torch.clamp(upper, max=max_ratio))
    return reference_bounds(batch[1], method, max_ratio=max_ratio)


@pytest.mark.parametrize("method", ["band", "clip", "clip-higher"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_loss_and_gradient_match_reference(batch, band_bounds, method, mode):
    log_prob, old, adv, mask = batch
    lower, upper = _bounds(batch, band_bounds, method)
    x = log_prob.clone().requires_grad_()
    loss, _ = band_policy_loss(x, old, adv, mask, delta=DELTA, loss_agg_mode=mode, method=method)
    (grad,) = torch.autograd.grad(loss, x)
    y = log_prob.clone().requires_grad_()
    ref = reference_loss(y, old, adv, mask, lower, upper, mode)
    (ref_grad,) = torch.autograd.grad(ref, y)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, ref, rtol=1e-11, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-11, atol=1e-300)


def test_clipping_is_active_in_the_test_batch(batch, band_bounds):
    """The reference comparison above is only meaningful if tokens are clipped on both sides."""
    _, metrics = band_policy_loss(*batch, delta=DELTA)
    assert float(metrics["clipfrac_high"]) > 0
    assert float(metrics["clipfrac_low"]) > 0
    _, metrics_fixed = band_policy_loss(*batch, method="clip")
    assert float(metrics_fixed["clipfrac"]) != float(metrics["clipfrac"])


@pytest.mark.parametrize("method", ["band", "clip"])
def test_dual_clip_matches_reference(batch, band_bounds, method):
    log_prob, old, adv, mask = batch
    lower, upper = _bounds(batch, band_bounds, method)
    c = 1.3  # small, so that some A < 0 tokens with r > c exist in the batch
    x = log_prob.clone().requires_grad_()
    loss, metrics = band_policy_loss(x, old, adv, mask, delta=DELTA, dual_clip=c, method=method)
    (grad,) = torch.autograd.grad(loss, x)
    y = log_prob.clone().requires_grad_()
    ref = reference_loss(y, old, adv, mask, lower, upper, "token-mean", dual_clip=c)
    (ref_grad,) = torch.autograd.grad(ref, y)
    torch.testing.assert_close(loss, ref, rtol=1e-11, atol=0)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-11, atol=1e-300)
    ratio = torch.exp(log_prob - old)
    expected = ((adv[:, None] < 0) & (ratio > c) & mask).sum() / mask.sum()
    assert float(metrics["dual_clipfrac"]) == pytest.approx(float(expected))
    assert float(expected) > 0
    # the dual clip zeroes the gradient of those tokens
    assert torch.all(grad[(adv[:, None] < 0) & (ratio > c) & mask] == 0)


def test_max_ratio_caps_the_upper_bound(batch, band_bounds):
    log_prob, old, adv, mask = batch
    lower, upper = _bounds(batch, band_bounds, "band", max_ratio=1.1)
    loss, metrics = band_policy_loss(log_prob, old, adv, mask, delta=DELTA, max_ratio=1.1)
    ref = reference_loss(log_prob, old, adv, mask, lower, upper, "token-mean")
    torch.testing.assert_close(loss, ref, rtol=1e-11, atol=0)
    _, metrics_uncapped = band_policy_loss(log_prob, old, adv, mask, delta=DELTA)
    assert float(metrics["clipfrac_high"]) > float(metrics_uncapped["clipfrac_high"])
    _, log_upper = log_ratio_bounds(old, max_ratio=1.1)
    assert float(log_upper.max()) == pytest.approx(math.log(1.1), rel=1e-15)


def test_max_ratio_on_a_rare_token():
    """p = 0.001: the KL Band at δ = 0.05 allows r up to 53.5; max_ratio = 10 clips r = 20."""
    old = torch.tensor([[math.log(0.001)]], dtype=torch.float64)
    new = old + math.log(20.0)
    adv, mask = torch.ones(1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool)
    loss, m = band_policy_loss(new, old, adv, mask)
    assert float(m["clipfrac"]) == 0 and float(loss) == pytest.approx(-20.0, rel=1e-12)
    loss, m = band_policy_loss(new, old, adv, mask, max_ratio=10.0)
    assert float(m["clipfrac_high"]) == 1 and float(loss) == pytest.approx(-10.0, rel=1e-12)
    _, log_upper = log_ratio_bounds(old)
    assert float(torch.exp(log_upper)) == pytest.approx(53.5480873143005, rel=1e-12)


def test_gradient_is_zero_exactly_for_tokens_clipped_on_the_pessimistic_side():
    """max(-A r, -A clip(r)) has zero gradient iff the clipped branch wins: A>0, r>u or A<0, r<l."""
    # p = 0.5, δ = 0.05 (KL): Band [0.6915, 1.3085]
    old = torch.full((1, 6), math.log(0.5), dtype=torch.float64)
    log_ratio = torch.tensor([[0.5, -0.6, -0.6, 0.5, 0.1, -0.1]], dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 6, dtype=torch.bool)
    x = (old + log_ratio).requires_grad_()
    loss, metrics = band_policy_loss(x, old, adv, mask)
    (grad,) = torch.autograd.grad(loss, x)
    ratio = torch.exp(log_ratio)
    expected = -adv * ratio / 6  # d(-A r)/d log π = -A r, token-mean over 6
    expected[0, :2] = 0.0  # A>0, r>u and A<0, r<l: clipped
    assert torch.equal(grad[0, :2], torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(grad, expected, rtol=1e-14, atol=0)
    assert float(metrics["clipfrac_high"]) == pytest.approx(1 / 6)
    assert float(metrics["clipfrac_low"]) == pytest.approx(1 / 6)
    assert float(metrics["clipfrac"]) == pytest.approx(2 / 6)
    # finite differences agree with autograd (the loss is piecewise smooth away from the bounds)
    eps = 1e-6
    for i in range(6):
        shift = torch.zeros_like(x)
        shift[0, i] = eps
        plus = band_policy_loss(x.detach() + shift, old, adv, mask)[0]
        minus = band_policy_loss(x.detach() - shift, old, adv, mask)[0]
        assert float((plus - minus) / (2 * eps)) == pytest.approx(float(grad[0, i]), abs=1e-9)


def test_advantage_shapes_agree(batch):
    log_prob, old, adv, mask = batch
    reference, _ = band_policy_loss(log_prob, old, adv, mask, method="clip")
    for shaped in (adv[:, None], adv[:, None].expand(B, T).clone()):
        loss, _ = band_policy_loss(log_prob, old, shaped, mask, method="clip")
        assert torch.equal(loss, reference)


def test_float_mask_equals_bool_mask(batch):
    log_prob, old, adv, mask = batch
    a, ma = band_policy_loss(log_prob, old, adv, mask, loss_agg_mode="seq-mean-token-mean")
    b, mb = band_policy_loss(log_prob, old, adv, mask.double(), loss_agg_mode="seq-mean-token-mean")
    assert torch.equal(a, b)
    assert all(torch.equal(ma[k], mb[k]) for k in ma)


def test_padding_may_hold_garbage(batch):
    """Masked positions with NaN/inf in any input change neither the loss, its gradient nor the metrics."""
    log_prob, old, adv, mask = batch
    adv_t = adv[:, None].expand(B, T).clone()
    x = log_prob.clone().requires_grad_()
    loss, metrics = band_policy_loss(x, old, adv_t, mask)
    (grad,) = torch.autograd.grad(loss, x)
    pad = ~mask
    dirty_lp = torch.where(pad, torch.nan, log_prob).requires_grad_()
    dirty_old = torch.where(pad, torch.inf, old)
    dirty_adv = torch.where(pad, torch.nan, adv_t)
    loss2, metrics2 = band_policy_loss(dirty_lp, dirty_old, dirty_adv, mask)
    (grad2,) = torch.autograd.grad(loss2, dirty_lp)
    assert torch.equal(loss, loss2)
    assert torch.equal(grad, grad2)
    assert torch.all(grad2[pad] == 0)
    for key in metrics:
        assert torch.equal(metrics[key], metrics2[key]), key


def test_nan_old_log_prob_at_a_valid_token_makes_the_loss_nan(batch):
    log_prob, old, adv, mask = batch
    old = old.clone()
    old[0, 0] = torch.nan
    for method in ("band", "clip"):
        loss, _ = band_policy_loss(log_prob, old, adv, mask, method=method)
        assert torch.isnan(loss), method
    log_lower, log_upper = log_ratio_bounds(old)
    assert torch.isnan(log_lower[0, 0]) and torch.isnan(log_upper[0, 0])
    assert not torch.isnan(log_upper[0, 1])


def test_metrics_by_hand(batch, band_bounds):
    log_prob, old, adv, mask = batch
    lower, upper = band_bounds
    _, metrics = band_policy_loss(log_prob, old, adv, mask)
    ratio = torch.exp(log_prob - old)
    a = adv[:, None].expand(B, T)
    n = mask.sum().double()
    high = (a > 0) & (ratio > upper) & mask
    low = (a < 0) & (ratio < lower) & mask
    high_fixed = (a > 0) & (ratio > 1.2) & mask
    low_fixed = (a < 0) & (ratio < 0.8) & mask
    expected = {
        "clipfrac_high": high.sum() / n,
        "clipfrac_low": low.sum() / n,
        "clipfrac": (high | low).sum() / n,
        "clipfrac_high_fixed": high_fixed.sum() / n,
        "clipfrac_low_fixed": low_fixed.sum() / n,
        "clipfrac_fixed": (high_fixed | low_fixed).sum() / n,
        "approx_kl": (-(log_prob - old))[mask].mean(),
        "approx_kl_k3": (ratio - 1 - (log_prob - old))[mask].mean(),
        "band_width": (upper - lower)[mask].mean(),
        "ratio_mean": ratio[mask].mean(),
    }
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        assert metrics[key].ndim == 0 and not metrics[key].requires_grad
        assert float(metrics[key]) == pytest.approx(float(value), rel=1e-11), key


def test_metrics_carry_no_gradient_and_stay_on_device(batch):
    log_prob, old, adv, mask = batch
    _, metrics = band_policy_loss(log_prob.clone().requires_grad_(), old, adv, mask, dual_clip=3.0)
    for value in metrics.values():
        assert isinstance(value, torch.Tensor) and not value.requires_grad and value.device == log_prob.device


def test_empty_mask_gives_zero_loss_and_zero_gradient(batch):
    log_prob, old, adv, _ = batch
    mask = torch.zeros(B, T, dtype=torch.bool)
    for mode in LOSS_AGG_MODES:
        x = log_prob.clone().requires_grad_()
        loss, metrics = band_policy_loss(x, old, adv, mask, loss_agg_mode=mode, method="clip")
        (grad,) = torch.autograd.grad(loss, x)
        assert float(loss.detach()) == 0.0 and torch.all(grad == 0), mode
        assert all(not torch.isnan(v) for v in metrics.values())


def test_float32_and_bfloat16_inputs(batch):
    log_prob, old, adv, mask = batch
    ref, _ = band_policy_loss(log_prob, old, adv, mask)
    loss32, _ = band_policy_loss(log_prob.float(), old.float(), adv.float(), mask)
    assert loss32.dtype == torch.float32
    assert float(loss32) == pytest.approx(float(ref), rel=1e-5)
    x = log_prob.bfloat16().requires_grad_()
    loss16, _ = band_policy_loss(x, old.bfloat16(), adv.bfloat16(), mask)
    assert loss16.dtype == torch.float32  # computed in at least fp32
    loss16.backward()
    assert x.grad.dtype == torch.bfloat16


def test_log_space_comparison_never_overflows():
    """fp32, p = e^-100: u ≈ e^97 overflows fp32 as a ratio, yet the loss and gradient are finite."""
    old = torch.tensor([[-100.0, -0.1]], dtype=torch.float32)
    x = (old + torch.tensor([[3.0, -1.0]])).requires_grad_()
    adv = torch.tensor([-1.0])
    mask = torch.ones(1, 2, dtype=torch.bool)
    for divergence in ("kl", "tv"):  # kl: u ≈ (1 - e^-δ)/p, l ≈ e^(-1-δ/p); tv: u = 1 + δ/p, l = 0
        loss, metrics = band_policy_loss(x, old, adv, mask, divergence=divergence)
        (grad,) = torch.autograd.grad(loss, x)
        assert torch.isfinite(loss) and torch.all(torch.isfinite(grad))
        assert float(metrics["clipfrac"]) == 0.5  # the p = e^-0.1 token is clipped below, A < 0


def test_saturated_lower_bound_is_minus_infinity():
    """TV at p <= δ: log l = -inf, so no ratio is ever clipped below."""
    old = torch.tensor([[math.log(0.01)]], dtype=torch.float64)
    log_lower, _ = log_ratio_bounds(old, divergence="tv", delta=0.05)
    assert float(log_lower) == -math.inf
    x = (old - 30.0).requires_grad_()
    loss, metrics = band_policy_loss(x, old, torch.tensor([-1.0], dtype=torch.float64),
                                     torch.ones(1, 1, dtype=torch.bool), divergence="tv")
    (grad,) = torch.autograd.grad(loss, x)
    assert float(metrics["clipfrac_low"]) == 0 and float(grad) != 0


def test_seq_mean_token_sum_norm_constant(batch):
    log_prob, old, adv, mask = batch
    default, _ = band_policy_loss(log_prob, old, adv, mask, loss_agg_mode="seq-mean-token-sum-norm",
                                  method="clip")
    fixed, _ = band_policy_loss(log_prob, old, adv, mask, loss_agg_mode="seq-mean-token-sum-norm",
                                method="clip", norm_length=4 * T)
    torch.testing.assert_close(fixed * 4, default, rtol=1e-15, atol=0)


def test_per_token_loss_is_zero_on_padding(batch):
    pg, _ = per_token_policy_loss(*batch, method="clip")
    assert pg.shape == (B, T) and torch.all(pg[~batch[3]] == 0)
    assert torch.equal(aggregate_loss(pg, batch[3]), band_policy_loss(*batch, method="clip")[0])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"method": "ppo"}, ValueError, "method must be one of .*'ppo'"),
        ({"delta": 0.0}, ValueError, "delta must be a finite number > 0, got 0.0"),
        ({"delta": float("nan")}, ValueError, "delta .* got nan"),
        ({"delta": "0.1"}, TypeError, "delta must be a real number, got '0.1'"),
        ({"dual_clip": 1.0}, ValueError, "dual_clip must be a finite number > 1, got 1.0"),
        ({"max_ratio": 0.9}, ValueError, "max_ratio must be a finite number > 1, got 0.9"),
        ({"method": "clip", "clip_eps": 1.5}, ValueError, r"clip_eps must be in \(0, 1\), got 1.5"),
        ({"method": "clip-higher", "clip_eps_high": -0.1}, ValueError, "clip_eps_high .* got -0.1"),
        ({"loss_agg_mode": "mean"}, ValueError, "loss_agg_mode must be one of .*'mean'"),
        ({"loss_agg_mode": "seq-mean-token-sum-norm", "norm_length": 0}, ValueError, "norm_length .* got 0"),
        ({"divergence": "no-such"}, ValueError, "no-such"),
    ],
)
def test_bad_arguments_are_named(batch, kwargs, error, match):
    with pytest.raises(error, match=match):
        band_policy_loss(*batch, **kwargs)


def test_bad_tensors_are_named(batch):
    log_prob, old, adv, mask = batch
    with pytest.raises(ValueError, match=r"old_log_prob must have the shape of log_prob \(4, 6\), got \(4, 5\)"):
        band_policy_loss(log_prob, old[:, :5], adv, mask)
    with pytest.raises(ValueError, match=r"advantages must have shape .* got \(3,\)"):
        band_policy_loss(log_prob, old, adv[:3], mask)
    with pytest.raises(ValueError, match=r"log_prob must have shape \(B, T\), got shape \(24,\)"):
        band_policy_loss(log_prob.reshape(-1), old.reshape(-1), adv, mask.reshape(-1))
    with pytest.raises(TypeError, match=r"log_prob must be a floating-point tensor, got dtype torch\.int64"):
        band_policy_loss(log_prob.long(), old, adv, mask)
    with pytest.raises(TypeError, match=r"advantages must be a torch\.Tensor, got list"):
        band_policy_loss(log_prob, old, [1.0] * B, mask)
    with pytest.raises(ValueError, match="mask must have the shape of log_prob"):
        band_policy_loss(log_prob, old, adv, mask[:, :2])


def test_precomputed_bounds_give_the_same_loss_and_gradient():
    """A trainer computes the bounds once per batch and passes slices: nothing may change."""
    gen = torch.Generator().manual_seed(3)
    old = -torch.rand(4, 6, generator=gen, dtype=torch.float64) * 6
    new = (old + 0.4 * torch.randn(4, 6, generator=gen, dtype=torch.float64)).requires_grad_()
    adv = torch.randn(4, generator=gen, dtype=torch.float64)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 4:] = False
    old_padded = torch.where(mask, old, torch.nan)  # padding may hold anything, bounds of it included
    bounds = log_ratio_bounds(old_padded, divergence="hellinger", delta=0.1)
    kwargs = dict(divergence="hellinger", delta=0.1, loss_agg_mode="seq-mean-token-mean")
    loss, metrics = band_policy_loss(new, old_padded, adv, mask, **kwargs)
    (grad,) = torch.autograd.grad(loss, new)
    loss_pre, metrics_pre = band_policy_loss(new, old_padded, adv, mask, log_bounds=bounds, **kwargs)
    (grad_pre,) = torch.autograd.grad(loss_pre, new)
    assert torch.equal(loss, loss_pre) and torch.equal(grad, grad_pre)
    assert all(torch.equal(metrics[k], metrics_pre[k]) for k in metrics)
    with pytest.raises(ValueError, match="log_bounds must be two tensors of shape"):
        band_policy_loss(new, old, adv, mask, log_bounds=(bounds[0][:, :3], bounds[1][:, :3]), **kwargs)


# ---------------------------------------------------------------------------------------------------------
# Import weight: the loss pulls torch and nothing heavy
# ---------------------------------------------------------------------------------------------------------

HEAVY = ("sympy", "cvxpy", "numba", "matplotlib")


def _python(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_bandcore_rl_is_light():
    assert _python("import sys, bandcore.rl; print('torch' in sys.modules)") == "False"
    loaded = _python(
        "import sys; from bandcore.rl import band_policy_loss, log_ratio_bounds; import bandcore.rl.bounds; "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    assert loaded == "[]"

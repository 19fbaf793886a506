"""Lookup tables: certified error on unseen points, saturation, asymptotics, array kinds, 2-D tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bandcore import BandTable
from bandcore.oracle import reference_band_log
from bandcore.tables import BandTable2D, rel_log_error
from bandcore.tables.pieces import bisection_band_log, log_p_of_x

SHIPPED_1D = [(name, delta) for name in ("kl", "tv", "pearson") for delta in (0.01, 0.05, 0.2)]


@pytest.fixture(scope="module")
def kl_table() -> BandTable:
    return BandTable.shipped("kl", 0.05)


def _unseen_log_p(seed: int, n: int = 4000) -> np.ndarray:
    """log p at random x = logit p over the whole table range plus the contract's extremes."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.uniform(-40, 40, n), rng.uniform(-680, 680, n // 4)])
    # (1 - p = 5e-324 and friends, x > 709, are checked against mpmath in test_extremes_against_oracle)
    extremes = np.array([-700.0, -699.5, -300.0, -1e-300, -1e-200, -1e-30, -np.log(2)])
    return np.concatenate([log_p_of_x(x), extremes])


# ---- the exact solver tables are built on ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["kl", "tv", "pearson"])
def test_bisection_solver_matches_mpmath_oracle(name):
    log_p = np.array([-700.0, -300.0, -40.0, -8.0, -3.0, -0.7, -0.05, -1e-3, -1e-9, -1e-30, -1e-200])
    for delta in (0.01, 0.2):
        lo, up = bisection_band_log(log_p, name, delta)
        exact_lo, exact_up = reference_band_log(name, log_p, delta)
        assert rel_log_error(lo, exact_lo).max() <= 1e-14
        assert rel_log_error(up, exact_up).max() <= 1e-14


# ---- certificate ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "delta"), SHIPPED_1D)
def test_shipped_certificate_holds_on_unseen_points(name, delta):
    table = BandTable.shipped(name, delta)
    assert table.max_rel_error <= 1e-7
    log_p = _unseen_log_p(seed=int(delta * 1000) + len(name))
    approx_lo, approx_up = table.log(log_p)
    exact_lo, exact_up = bisection_band_log(log_p, name, delta)
    assert rel_log_error(approx_lo, exact_lo).max() <= table.max_rel_error
    assert rel_log_error(approx_up, exact_up).max() <= table.max_rel_error


@pytest.mark.parametrize("name", ["kl", "tv", "pearson"])
def test_fresh_build_certificate_holds_on_unseen_points(name):
    table = BandTable.build(name, 0.037)
    assert 0 < table.max_rel_error <= 1e-7
    assert table.recertify(7, seed=3) <= table.max_rel_error


def test_certificate_against_mpmath_oracle(kl_table):
    rng = np.random.default_rng(11)
    log_p = log_p_of_x(rng.uniform(-30, 30, 24))
    exact_lo, exact_up = reference_band_log("kl", log_p, 0.05)
    lo, up = kl_table.log(log_p)
    assert rel_log_error(lo, exact_lo).max() <= kl_table.max_rel_error
    assert rel_log_error(up, exact_up).max() <= kl_table.max_rel_error


@pytest.mark.parametrize("name", ["kl", "tv", "pearson"])
def test_extremes_against_oracle(name):
    table = BandTable.shipped(name, 0.05)
    log_p = np.array([-5e-324, -1e-310, -1e-300, -700.0, -1e-12])
    exact_lo, exact_up = reference_band_log(name, log_p, 0.05)
    lo, up = table.log(log_p)
    assert rel_log_error(lo, exact_lo).max() <= table.max_rel_error
    assert rel_log_error(up, exact_up).max() <= table.max_rel_error


def test_build_target_controls_knots():
    coarse = BandTable.build("tv", 0.1, target=1e-5)
    assert coarse.max_rel_error <= 1e-5
    assert coarse.n_knots < BandTable.shipped("tv", 0.1).n_knots


# ---- saturation and asymptotics ------------------------------------------------------------------------------


def test_tv_saturation_is_exact_on_both_sides_of_the_kink():
    delta = 0.05
    table = BandTable.shipped("tv", delta)
    # lower saturates iff p <= δ, upper iff p >= 1 - δ
    p = np.array([1e-9, 0.01, delta * (1 - 1e-12), 0.5, 1 - delta * (1 - 1e-12), 0.99, 1 - 1e-12])
    log_p = np.log(p)
    lo, up = table.log(log_p)
    assert np.all(np.isneginf(lo[p <= delta]))
    assert np.all(up[p >= 1 - delta] == -log_p[p >= 1 - delta])
    np.testing.assert_allclose(np.exp(lo[3]), 1 - delta / 0.5, rtol=1e-7)
    np.testing.assert_allclose(np.exp(up[3]), 1 + delta / 0.5, rtol=1e-7)
    # just past the kink the bound is tiny but relative accuracy holds
    p_near = delta * (1 + np.array([1e-3, 1e-6, 1e-9]))
    lo_near, _ = table.log(np.log(p_near))
    np.testing.assert_allclose(np.exp(lo_near), 1 - delta / p_near, rtol=1e-6)


def test_pearson_saturation_thresholds_are_knots():
    delta = 0.2
    table = BandTable.shipped("pearson", delta)
    # upper saturates iff p >= 1/(1+δ), lower iff p <= δ/(1+δ); in L = -log p the grid ends there
    assert table.upper.saturated_left and table.lower.saturated_right
    assert math.isclose(table.upper.knots[0], math.log1p(delta), rel_tol=1e-14)
    assert math.isclose(table.lower.knots[-1], math.log((1 + delta) / delta), rel_tol=1e-14)


def test_outside_the_grid_uses_the_asymptotics(kl_table):
    log_p = np.array([-690.0, -700.0, -720.0])
    lo, up = kl_table.log(log_p)
    exact_lo, exact_up = bisection_band_log(log_p[:2], "kl", 0.05)
    assert rel_log_error(lo[:2], exact_lo).max() <= kl_table.max_rel_error
    assert rel_log_error(up[:2], exact_up).max() <= kl_table.max_rel_error
    # KL: r_up -> (1 - e^-δ)/p and log r_lo -> -(δ + ...)/p as p -> 0; finite and monotone far out
    assert np.all(np.diff(up) > 0) and np.all(np.diff(lo) < 0)
    np.testing.assert_allclose(up[2], math.log(-math.expm1(-0.05)) + 720.0, rtol=1e-12)


def test_p_equal_one_nan_and_tolerance(kl_table):
    lo, up = kl_table.log(np.array([0.0, 1e-7, np.nan, -0.0]))
    assert up[0] == 0 and up[1] == 0  # r_up(1) = 1
    np.testing.assert_allclose(lo[[0, 1, 3]], -0.05, rtol=1e-12)  # KL: r_lo(1) = e^{-δ}
    assert np.isnan(lo[2]) and np.isnan(up[2])
    with pytest.raises(ValueError, match=r"old_log_prob must be <= 0.*0\.5"):
        kl_table.log(np.array([-1.0, 0.5]))
    with pytest.raises(TypeError, match="old_log_prob"):
        kl_table.log(np.array([-1, -2]))


def test_monotone_and_contains_one(kl_table):
    log_p = np.sort(log_p_of_x(np.linspace(-60, 60, 20001)))
    lo, up = kl_table.log(log_p)
    assert np.all(lo <= 0) and np.all(up >= 0)
    # monotone up to the certified error: q_up = p·r_up and r_lo increase with p
    tol = 2 * kl_table.max_rel_error
    assert np.all(np.diff(up + log_p) >= -tol)
    assert np.all(np.diff(lo) >= -tol * np.maximum(1, np.abs(lo[1:])))


# ---- array kinds ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(), (7,), (3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_shape_and_dtype_kept(kl_table, shape, dtype):
    rng = np.random.default_rng(0)
    log_p = (-rng.exponential(2.0, size=shape)).astype(dtype)
    lo, up = kl_table.log(log_p)
    assert lo.shape == shape and up.shape == shape and lo.dtype == dtype and up.dtype == dtype
    ref_lo, _ = kl_table.log(log_p.astype(np.float64))
    np.testing.assert_array_equal(lo, ref_lo.astype(dtype))  # computed in float64, rounded once
    ratio_lo, ratio_up = kl_table(log_p)  # exp of the float64 log bounds, rounded once to the input dtype
    assert ratio_lo.dtype == ratio_up.dtype == dtype
    ref_lo, ref_up = kl_table.log(log_p.astype(np.float64))
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(ratio_lo, np.exp(ref_lo), rtol=tol)
    np.testing.assert_allclose(ratio_up, np.exp(ref_up), rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_torch_matches_numpy(kl_table, dtype):
    log_p = torch.tensor(_unseen_log_p(1, 500)[:600], dtype=torch.float64).to(dtype).reshape(-1, 3)
    log_p.requires_grad_(dtype != torch.bfloat16)
    lo, up = kl_table.log(log_p)
    assert lo.dtype == dtype and lo.shape == log_p.shape and not lo.requires_grad
    ref_lo, ref_up = kl_table.log(log_p.detach().to(torch.float64).numpy())
    for got, ref in ((lo, ref_lo), (up, ref_up)):  # the same float64 arithmetic up to operation order
        rounded = torch.tensor(ref).to(dtype).double().numpy()
        # (log r_lo = -exp(F) with F up to ~745: one ulp of F is ~1.7e-13 relative)
        tol = {torch.float64: 2e-13, torch.float32: 6e-8, torch.bfloat16: 4e-3}[dtype]
        assert rel_log_error(got.double().numpy(), rounded).max() <= tol


@pytest.mark.parametrize("name", ["kl", "tv", "pearson"])
def test_torch_device_kernel_matches_numba(name):
    """The torch kernel (used on GPUs; CPU tensors take the Numba path) run here on CPU tensors."""
    from bandcore.tables.evaluate import eval_log_torch

    table = BandTable.shipped(name, 0.05)
    log_p = np.concatenate([_unseen_log_p(4, 2000), [0.0, -0.0, 1e-7, 0.5, np.nan, -np.inf, -1e4]])
    lo, up = eval_log_torch(torch.from_numpy(log_p), *table._torch_arrays(torch.device("cpu")), 1e-6)
    ref_lo, ref_up = table.log(log_p[log_p <= 1e-6])
    for got, ref in ((lo, ref_lo), (up, ref_up)):
        got = got.numpy()
        assert np.isnan(got[log_p > 1e-6]).all()  # log p = 0.5 and NaN: NaN, no host sync
        # (log r_lo = -exp(F) with F up to ~745: one ulp of F is ~1.7e-13 relative)
        assert rel_log_error(got[log_p <= 1e-6], ref).max() <= 2e-13


def test_torch_saturation_nan_and_positive(kl_table):
    tv = BandTable.shipped("tv", 0.05)
    log_p = torch.tensor([math.log(0.01), math.log(0.999), float("nan"), 0.5, 0.0], dtype=torch.float64)
    lo, up = tv.log(log_p)
    assert torch.isneginf(lo[0]) and up[1] == -log_p[1]
    assert torch.isnan(lo[2]) and torch.isnan(lo[3]) and torch.isnan(up[3])  # log p > 1e-6: NaN, no sync
    assert up[4] == 0


# ---- 2-D tables ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kl_2d() -> BandTable2D:
    return BandTable.shipped("kl", (0.01, 0.2))


def test_2d_certificate_on_random_deltas(kl_2d):
    assert kl_2d.max_rel_error <= 1e-7
    rng = np.random.default_rng(5)
    log_p = _unseen_log_p(2, 1500)
    for delta in np.exp(rng.uniform(math.log(0.01), math.log(0.2), 4)):
        lo, up = kl_2d.log(log_p, float(delta))
        exact_lo, exact_up = bisection_band_log(log_p, "kl", float(delta))
        assert rel_log_error(lo, exact_lo).max() <= kl_2d.max_rel_error
        assert rel_log_error(up, exact_up).max() <= kl_2d.max_rel_error


def test_2d_agrees_with_1d_at_a_knot_delta(kl_2d, kl_table):
    log_p = _unseen_log_p(3, 500)
    for a, b in zip(kl_2d.log(log_p, 0.05), kl_table.log(log_p), strict=True):
        assert rel_log_error(a, b).max() <= kl_2d.max_rel_error + kl_table.max_rel_error


def test_2d_refuses_bad_delta(kl_2d):
    with pytest.raises(ValueError, match="outside"):
        kl_2d.log(np.array([-1.0]), 0.5)
    with pytest.raises(ValueError, match="delta"):
        BandTable.build("kl", -0.1)

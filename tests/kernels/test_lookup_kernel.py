"""The Numba table kernel (three loops per bound, pending tokens packed, tails apart) against the NumPy binding of
the same source, on every kind of bound the shipped tables have, serial and parallel, float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest

from bandcore.kernels.lookup_drivers import run_lookup
from bandcore.tables import BandTable

#: kinds (lower, upper): kl (2, 0), neyman (3, 0), hellinger and tv (4, 0), js (4, 5); reverse_kl (4, 5) with a
#: left tail on its lower bound and a Newton right tail on its upper one
TABLES = ["kl", "neyman", "hellinger", "tv", "js", "reverse_kl"]
SPECIAL = [0.0, -0.0, 1e-7, 2e-6, 0.5, np.nan, -np.inf, -1e4, -700.0, -5e-324, -1e-300]


def _log_p(n: int, seed: int) -> np.ndarray:
    """Log-uniform p over [1e-300, 1] with the special values scattered (so they land in different blocks)."""
    rng = np.random.default_rng(seed)
    x = -np.exp(rng.uniform(-40.0, 6.6, n))
    x[rng.choice(n, size=len(SPECIAL) * 3, replace=False)] = np.tile(SPECIAL, 3)
    return x


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    same = (got == ref) | (np.isnan(got) & np.isnan(ref))
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(got - ref) / np.maximum(1.0, np.abs(ref)))
    return float(np.nan_to_num(err, nan=np.inf).max())


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("n", [1000, 20_000])  # serial and parallel drivers
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numba_kernel_matches_numpy(name, n, dtype):
    table = BandTable.shipped(name, 0.05)
    log_p = _log_p(n, n).astype(dtype)
    lower, upper = table.lower.kernel, table.upper.kernel
    got_lo, got_up, above = run_lookup(log_p, lower, upper, dtype, 1e-6, "numba")
    ref_lo, ref_up, ref_above = run_lookup(log_p, lower, upper, dtype, 1e-6, "numpy")
    assert above == ref_above
    # the fast exp/log are within 2 ulp of libm; log r_lo = -exp(F) with F up to ~745: 1.7e-13 per ulp of F
    assert _rel(got_lo, ref_lo) <= 2e-13 and _rel(got_up, ref_up) <= 2e-13


@pytest.mark.parametrize("name", ["kl", "js", "reverse_kl", "hellinger"])
@pytest.mark.parametrize("n", [1000, 20_000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ratio_output_is_exp_of_the_log_bounds(name, n, dtype):
    """``ratios=True`` (BandTable.__call__): within 2 ulp of NumPy's exp of the kernel's own log bounds (0 where a
    lower bound saturates, NaN and inf where the log bounds are): the kernel's fast exp of them, or, in a split
    lower bound (js, reverse KL, Hellinger), the r its far part stores and the H lambda^k of its near part,
    where the exp of the rounded log r is the less accurate one, by up to |log r| ulp; in reverse KL's left
    tail (log p = 0), exp of the log bound."""
    table = BandTable.shipped(name, 0.05)
    log_p = _log_p(n, n + 1).astype(dtype)
    lower, upper = table.lower.kernel, table.upper.kernel
    log_lo, log_up, _ = run_lookup(log_p, lower, upper, np.float64, 1e-6, "numba")
    got_lo, got_up, above = run_lookup(log_p, lower, upper, dtype, 1e-6, "numba", ratios=True)
    assert above == int(np.count_nonzero(log_p > 1e-6))
    for got, logs in ((got_lo, log_lo), (got_up, log_up)):
        with np.errstate(over="ignore", invalid="ignore"):
            ref = np.exp(logs).astype(dtype)
            same = (got == ref) | (np.isnan(got) & np.isnan(ref))
            ulps = np.abs(got.astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(dtype)).astype(np.float64)
        allowed = 2.0 + (np.abs(logs) if dtype == np.float64 else 0.0)  # float32: both round to the same ulp
        assert np.all(same | (ulps <= allowed)), (got[~same][:5], ref[~same][:5])
    valid = ~(log_p > 1e-6)  # (the table's public call raises for them)
    ratio_lo, ratio_up = table(log_p[valid], backend="numba")
    assert np.array_equal(ratio_lo, got_lo[valid], equal_nan=True)
    assert np.array_equal(ratio_up, got_up[valid], equal_nan=True)

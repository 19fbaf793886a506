"""User generators (formulas in u) solved exactly on every backend, against the 50-digit oracle.

The generators grow exponentially (log cosh, softplus, cosh, exp: their functions would overflow as written),
have a kink of a higher derivative at u = 1 (|u - 1|^1.5, |u - 1|^3), vanish to fourth order there
((u - 1)^4), have a fractional power (u^{5/2}), or are piecewise (the hockey stick max(u - 2, 0), flat on
[0, 2]; Huber, whose pieces meet at |u - 1| = 1).  Each one is checked at the regular points, the far tails
(log p down to -5000 and up to 1 - 1e-30) and next to its saturation thresholds, with δ spread over
{1e-8, 1e-3, 0.05, 1, 10}, on NumPy, Numba and torch (CPU), for fp64 and fp32 inputs.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
import torch
from tiers import crossed

import bandcore as bc
from bandcore.oracle import reference_band_log

EPS = np.finfo(float).eps
BACKENDS = ["numpy", "numba", "torch"]
#: generator -> the two δ it is checked at (every δ of {1e-8, 1e-3, 0.05, 1, 10} is used by several)
GENERATORS = {
    "log(cosh(u-1))": (0.05, 10.0),
    "log(1+exp(u-1)) - log(2) - (u-1)/2": (1e-3, 1.0),
    "cosh(u-1) - 1": (0.05, 1e-8),
    "exp(u-1) - u": (1.0, 1e-3),
    "abs(u-1)**1.5": (10.0, 0.05),
    "abs(u-1)**3": (1e-8, 1.0),
    "(u-1)**4": (1e-3, 10.0),
    "u**(5/2) - 5*u/2 + 3/2": (0.05, 1e-8),
    "max(u - 2, 0)": (0.05, 1.0),
    "where(abs(u-1) < 1, (u-1)**2/2, abs(u-1) - 1/2)": (1e-3, 10.0),
}
CASES = [(name, delta) for name, deltas in GENERATORS.items() for delta in deltas]
#: on Numba (a module compiled per generator) the fast tier runs an exponential and a piecewise one; the full
#: suite runs them all
FAST_NUMBA = ["cosh(u-1) - 1", "max(u - 2, 0)"]
#: regular points and far tails: p from 1 - 1e-30 down to e^-5000, across e^-700 (where p becomes subnormal)
TAILS = np.array([-1e-30, -1e-12, -1e-4, -0.1, -0.69, -2.0, -8.0, -40.0, -300.0, -701.0, -745.0, -1500.0, -5000.0])


def _thresholds(name: str, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """log p at relative distances 1e-8 on both sides of each saturation threshold in (0, 1), and their η."""
    derived = bc.derive(name)
    log_p, eta = [], []
    for threshold in (derived.saturation_upper(delta), derived.saturation_lower(delta)):
        if 0.0 < threshold < 1.0:
            for sign in (-1.0, 1.0):
                p = threshold * (1.0 + sign * 1e-8)
                if p >= 1.0:
                    continue
                log_p.append(math.log(p))
                eta.append(abs(p - threshold) / threshold)
    return np.array(log_p), np.array(eta)


@cache
def _case(name: str, delta: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(log p, allowed error, oracle lower, oracle upper) of one (generator, δ), computed once per session."""
    near, eta = _thresholds(name, delta)
    log_p = np.concatenate([TAILS, near])
    # next to a threshold p*, a relative change ε of p moves log r by ~ε p/|p - p*|: allowed eps/η besides 1e-12
    allowed = np.concatenate([np.full(TAILS.size, 1e-12), np.maximum(1e-12, 64 * EPS / eta)])
    lower, upper = reference_band_log(name, log_p, delta)
    return log_p, allowed, lower, upper


def _solve(backend: str, log_p: np.ndarray, name: str, delta: float):
    x = torch.from_numpy(log_p) if backend == "torch" else log_p
    lower, upper, status = bc.band_log(x, name, delta, backend=backend, return_status=True)
    return np.asarray(lower), np.asarray(upper), np.asarray(status)


def _assert_close(got: np.ndarray, want: np.ndarray, allowed: np.ndarray, what: str) -> None:
    infinite = np.isinf(want)
    assert np.array_equal(got[infinite], want[infinite]), what  # a saturated lower bound is exactly -inf
    finite = ~infinite
    assert np.all(np.isfinite(got[finite])), what  # no NaN or inf where the bound is finite
    err = np.abs(got[finite] - want[finite]) / np.maximum(1.0, np.abs(want[finite]))
    assert np.all(err <= allowed[finite]), (what, float(err.max()))


@pytest.mark.parametrize(("name", "delta", "backend"), crossed(CASES, BACKENDS, FAST_NUMBA))
def test_against_the_oracle(name, delta, backend):
    log_p, allowed, ref_lower, ref_upper = _case(name, delta)
    lower, upper, status = _solve(backend, log_p, name, delta)
    what = f"{name} δ={delta} {backend}"
    assert not np.any(status == bc.Status.NOT_CONVERGED), what
    _assert_close(lower, ref_lower, allowed, what + " lower")
    _assert_close(upper, ref_upper, allowed, what + " upper")
    saturated = ref_upper == -log_p  # the oracle's saturated upper bound is exactly 1/p: so is the kernel's
    assert np.array_equal(upper[saturated], -log_p[saturated]), what


@pytest.mark.parametrize(("name", "backend"), crossed(GENERATORS, BACKENDS, FAST_NUMBA))
def test_float32_inputs_and_nan(name, backend):
    delta = GENERATORS[name][0]
    log_p, _, ref_lower, ref_upper = _case(name, delta)
    x = np.append(log_p[: TAILS.size], np.nan).astype(np.float32)
    exact = x.astype(np.float64) == np.append(log_p[: TAILS.size], np.nan)  # points fp32 represents exactly
    if backend == "torch":
        lower, upper = (t.numpy() for t in bc.band_log(torch.from_numpy(x), name, delta, backend=backend))
    else:
        lower, upper = bc.band_log(x, name, delta, backend=backend)
    assert lower.dtype == upper.dtype == np.float32
    assert np.isnan(lower[-1]) and np.isnan(upper[-1])  # NaN in, NaN out
    # the fp64 bound of the fp32 input rounded once: within one fp32 rounding of the oracle
    fp64_lower, fp64_upper, _ = _solve(backend, x.astype(np.float64), name, delta)
    assert np.array_equal(lower, fp64_lower.astype(np.float32), equal_nan=True)
    assert np.array_equal(upper, fp64_upper.astype(np.float32), equal_nan=True)
    at = exact[:-1]
    for got, want in ((lower[:-1][at], ref_lower[: TAILS.size][at]), (upper[:-1][at], ref_upper[: TAILS.size][at])):
        finite = np.isfinite(want)
        assert np.array_equal(got[~finite], want[~finite].astype(np.float32)), name
        err = np.abs(got[finite] - want[finite]) / np.maximum(1.0, np.abs(want[finite]))
        assert np.all(err <= np.finfo(np.float32).eps), (name, backend, float(err.max()))

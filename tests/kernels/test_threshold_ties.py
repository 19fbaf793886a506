"""Saturation next to its threshold, at the float neighbours of log p*, against mpmath (docs/math.md §3, §9).

The input is the float log p and the threshold log p* is irrational, so whether p = e^(log p) saturates is decided
by digits of log p* beyond the 53rd. TV and Pearson decide it exactly (double-double thresholds) and meet the
contract at every float next to log p*, on every backend, as log bounds and as ratios. Every other generator
decides it from the floating-point G(inf) (the generic solver): there each result is the exact Band of an input
within CARVE_OUT of log p (status and lower bound), and the status differs from the exact one only within
STATUS_WIDTH of log p*; both measured here on the catalogue's bounded generators.
"""

from __future__ import annotations

import math
from functools import cache

import mpmath as mp
import numpy as np
import pytest

import bandcore as bc
from bandcore.oracle import band_log_mp, g_mp

BACKENDS = ["numpy", "numba", "torch"]
EPS = 2.0**-52
#: docs/math.md §3: the generic solver's results are the exact Band at some log p' within this of log p
CARVE_OUT = 48 * EPS
#: docs/math.md §3: ... and its status differs from the exact one only this close to log p*
STATUS_WIDTH = 16 * EPS
CONTRACT = 1e-12


def _backend(name: str) -> str:
    if name == "torch":
        pytest.importorskip("torch")
    return name


def _neighbours(x: float, k: int) -> np.ndarray:
    """The 2k + 1 floats around x (x itself in the middle)."""
    below, above = [x], [x]
    for _ in range(k):
        below.append(float(np.nextafter(below[-1], -np.inf)))
        above.append(float(np.nextafter(above[-1], np.inf)))
    return np.array(sorted(set(below + above)))


def _closed_thresholds(name: str, delta: float) -> dict[str, mp.mpf]:
    """log p* of each side at 60 digits, from the float delta's exact value (only the sides with 0 < p* < 1)."""
    with mp.workdps(60):
        d = mp.mpf(delta)
        p_up, p_lo = (1 - d, d) if name == "tv" else (1 / (1 + d), d / (1 + d))
        return {side: mp.log(p) for side, p in (("upper", p_up), ("lower", p_lo)) if 0 < p < 1}


def _contract_error(got: float, ref: mp.mpf) -> float:
    """|Δ log r| / max(1, |log r|), 0 where both are the same infinity."""
    if mp.isinf(ref):
        return 0.0 if got == float(ref) else math.inf
    return abs(got - float(ref)) / max(1.0, abs(float(ref)))


def _ratio_error(got: float, log_ref: mp.mpf) -> float:
    """The contract's measure for a ratio: relative in r for e^-1 <= r <= e, in log r beyond."""
    if mp.isinf(log_ref):
        return 0.0 if got == (0.0 if log_ref < 0 else math.inf) else math.inf
    if float(log_ref) > 709.7:  # beyond the float range: the correctly rounded inf
        return 0.0 if got == math.inf else math.inf
    if abs(log_ref) <= 1:
        return float(abs(got - mp.exp(log_ref)) / mp.exp(log_ref))
    return _contract_error(math.log(got), log_ref) if got > 0 else math.inf


TIE_CASES = [(name, delta) for name in ("tv", "pearson") for delta in (1e-8, 1e-3, 0.05, 0.5, 3.0, 1000.0)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, delta", TIE_CASES)
def test_closed_forms_decide_saturation_exactly_at_every_float_next_to_a_threshold(name, delta, backend):
    """Status and both bounds (log bounds and ratios) at the 9 floats around fl(log p*) of each side and at a
    few relative distances from it, against the 50-digit oracle: exact status, contract accuracy."""
    backend = _backend(backend)
    thresholds = _closed_thresholds(name, delta)
    points = [np.array([-1e-300, -1e-12, -0.3, -30.0])]
    for log_threshold in thresholds.values():
        centre = float(log_threshold)
        points += [_neighbours(centre, 4), centre * (1 + np.array([1e-15, -1e-15, 1e-12, -1e-12, 1e-6, -1e-6]))]
    log_p = np.unique(np.concatenate(points))
    log_p = log_p[log_p < 0]
    reference = [band_log_mp(name, x, delta) for x in log_p]
    log_lower, log_upper, status = bc.band_log(log_p, name, delta, backend=backend, return_status=True)
    lower, upper, ratio_status = bc.band(log_p, name, delta, backend=backend, return_status=True)
    for i, x in enumerate(log_p):
        ref_lower, ref_upper = reference[i]
        saturated = ref_lower == mp.ninf or ref_upper == -mp.mpf(x)
        where = f"{name} delta={delta} log p={x!r}"
        assert status[i] == ratio_status[i] == int(saturated), where
        assert _contract_error(log_lower[i], ref_lower) <= CONTRACT, (where, log_lower[i], ref_lower)
        assert _contract_error(log_upper[i], ref_upper) <= CONTRACT, (where, log_upper[i], ref_upper)
        assert _ratio_error(lower[i], ref_lower) <= CONTRACT, (where, lower[i], ref_lower)
        assert _ratio_error(upper[i], ref_upper) <= CONTRACT, (where, upper[i], ref_upper)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tv_at_the_float_nearest_log_delta_is_not_saturated(backend):
    """docs/math.md §3: at log p = fl(log 0.05), p - 0.05 = +4.18e-18 exactly, so r_lo = 1 - δ/p > 0:
    log r_lo = -37.0196, status CONVERGED (it was -inf, SATURATED, before the thresholds were double-doubles)."""
    backend = _backend(backend)
    log_p = np.array([math.log(0.05)])
    with mp.workdps(50):
        p = mp.exp(mp.mpf(log_p[0]))
        assert mp.almosteq(p - mp.mpf(0.05), mp.mpf("4.1835e-18"), rel_eps=1e-4)
        exact = mp.log(1 - mp.mpf(0.05) / p)
    assert abs(float(exact) - -37.0196) < 5e-5
    log_lower, _, status = bc.band_log(log_p, "tv", 0.05, backend=backend, return_status=True)
    assert status[0] == bc.Status.CONVERGED
    assert _contract_error(log_lower[0], exact) <= CONTRACT


@cache
def _threshold(div: bc.Divergence, delta: float, side: str) -> mp.mpf | None:
    """log p* at 40 digits by bisection of g_f(p, 1/p) = δ (upper) or g_f(p, 0) = δ (lower); None if that side
    saturates for every p or never."""
    with mp.workdps(40):
        d = mp.mpf(delta)

        def h(L):
            return g_mp(div, L, -L if side == "upper" else mp.ninf) - d

        a, b = mp.mpf(-745), -mp.mpf(10) ** -25
        inside_a = h(a) <= 0
        if inside_a == (h(b) <= 0):
            return None
        for _ in range(160):
            m = (a + b) / 2
            if (h(m) <= 0) == inside_a:
                a = m
            else:
                b = m
        return (a + b) / 2


def _inside(div: bc.Divergence, log_p: float, log_r: float, delta: float) -> bool:
    """g_f(p, r) <= δ at 40 digits (log_r = -inf: r = 0)."""
    with mp.workdps(40):
        return bool(g_mp(div, mp.mpf(log_p), mp.mpf(log_r)) <= mp.mpf(delta))


def _saturated(div: bc.Divergence, side: str, log_p: float, delta: float) -> bool:
    """Whether ``side`` of the Band at ``log_p`` is saturated, at 40 digits."""
    return _inside(div, log_p, -log_p if side == "upper" else -math.inf, delta)


#: generators solved by the generic solver whose bounds saturate, at radii including the widest measured cases
HUBER = "where(abs(u-1) < 1, (u-1)**2/2, abs(u-1) - 1/2)"
GENERIC_CASES = [("hellinger", 0.05), ("lecam", 0.5), ("reverse_kl", 0.5), ("js", 0.05), ("alpha(0.7)", 0.157143),
                 ("alpha(0.7)", 0.218547), ("alpha(0.7)", 0.5), ("alpha(3)", 2.0), (HUBER, 0.3)]  # fmt: skip
#: the generic carve-out on NumPy in the fast tier, on every backend in the slow one
GENERIC_BACKENDS = ["numpy", *(pytest.param(name, marks=pytest.mark.slow) for name in ("numba", "torch"))]


@pytest.mark.parametrize("backend", GENERIC_BACKENDS)
@pytest.mark.parametrize("name, delta", GENERIC_CASES)
def test_generic_solver_is_exact_for_an_input_within_the_carve_out(name, delta, backend):
    """docs/math.md §3: next to a threshold, every result of the generic solver is the exact Band at some
    log p' with |log p' - log p| <= 48·2^-52 (status, and the lower bound between the exact lower bounds at
    log p ∓ 48·2^-52), its status differs from the exact one only within 16·2^-52 of log p*, and the upper
    bound meets the contract (it is continuous there). Checked on the 25 floats around fl(log p*) of each side,
    80 more spread over ±64·2^-52, and points 1e-12 and 1e-9 (relative) away.  (alpha(0.7) at δ = 0.5: the float
    nearest log p*_lo, where the rounded G stays below δ up to d = inf, was NaN with status CONVERGED.)"""
    backend = _backend(backend)
    div = bc.resolve(name)
    thresholds = {side: _threshold(div, delta, side) for side in ("upper", "lower")}
    for side, log_threshold in thresholds.items():
        if log_threshold is None:
            continue
        centre = float(log_threshold)
        window = np.linspace(centre - 64 * EPS, centre + 64 * EPS, 81)
        far = centre * (1 + np.array([1e-12, -1e-12, 1e-9, -1e-9]))
        log_p = np.unique(np.concatenate([_neighbours(centre, 12), window, far]))
        log_p = log_p[log_p < 0]
        log_lower, log_upper, status = bc.band_log(log_p, div, delta, backend=backend, return_status=True)
        for i, x in enumerate(log_p):
            where = f"{name} delta={delta} {side} log p={x!r} ({float(x - log_threshold) / EPS:.2f} eps from log p*)"
            early, late = x - CARVE_OUT, x + CARVE_OUT
            exact_status = any(x >= t if s == "upper" else x <= t for s, t in thresholds.items() if t is not None)
            if bool(status[i]) != exact_status:
                assert min(abs(float(x - t)) for t in thresholds.values() if t is not None) <= STATUS_WIDTH, where
            # the status is that of an input within CARVE_OUT: upper saturates from log p* up, lower up to it
            sides = [s for s, t in thresholds.items() if t is not None]
            if status[i]:
                assert any(_saturated(div, s, late if s == "upper" else early, delta) for s in sides), where
            else:
                assert not any(_saturated(div, s, early if s == "upper" else late, delta) for s in sides), where
            if side == "upper":  # continuous at its threshold: the contract holds
                reference = band_log_mp(div, x, delta, dps=40)[1]
                assert _contract_error(log_upper[i], reference) <= CONTRACT, (where, log_upper[i], reference)
            else:  # the lower bound rises with p: between the exact bounds at log p -+ CARVE_OUT
                value = log_lower[i]
                assert not np.isnan(value), where
                slack = CONTRACT * max(1.0, abs(value)) if np.isfinite(value) else 0.0
                assert _inside(div, early, value + slack, delta), (where, value)  # >= exact lower at early
                if np.isfinite(value):
                    assert not _inside(div, late, value - slack, delta), (where, value)  # <= exact lower at late

"""The examples and catalogue values of docs/math.md, computed with mpmath (60 digits) and with band_log.

Each test is named beside the figure it backs in docs/math.md.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest

import bandcore as bc
from bandcore.oracle import band_log_mp


def test_one_minus_one_minus_p_rounds_tiny_p_to_zero():
    """§2: 1 - (1 - p) is 0 for every p at or below 2^-54, so log(1 - p) is taken as log(-expm1(log p))."""
    assert 1.0 - (1.0 - 2.0**-54) == 0.0
    assert 1.0 - (1.0 - np.nextafter(2.0**-54, 1.0)) > 0.0


SUPREMA = [("tv", 1.0), ("hellinger", 2.0), ("lecam", 2.0), ("js", math.log(2.0)), ("alpha(0.5)", 4.0),
           ("alpha(0.3)", 1 / 0.21)]  # fmt: skip
P_GRID = np.log(np.concatenate([np.logspace(-12, -1, 12), np.linspace(0.15, 0.95, 9), 1 - np.logspace(-2, -12, 6)]))


@pytest.mark.parametrize("name, supremum", SUPREMA)
def test_bounded_divergences_saturate_everywhere_above_their_supremum(name, supremum):
    """§3: both sides saturate for every p iff δ >= sup D_f = f̃(0) + σ∞ (TV 1, Hellinger and Le Cam 2,
    JS log 2, α in (0, 1): 1/(α(1 - α))); just below it the rarest tokens' upper bound and the likeliest
    tokens' lower bound are not saturated."""
    log_lower, log_upper, status = bc.band_log(P_GRID, name, supremum * 1.001, return_status=True)
    assert np.all(status == bc.Status.SATURATED)
    assert np.all(log_lower == -np.inf)
    np.testing.assert_array_equal(log_upper, -P_GRID)
    log_lower, log_upper, _ = bc.band_log(P_GRID, name, supremum * 0.999, return_status=True)
    assert log_upper[0] < -P_GRID[0] and log_lower[-1] > -np.inf


@pytest.mark.parametrize("delta", [0.05, 1.5, 3.0])
def test_lower_bound_at_p_one(delta):
    """§4: r_lo at p = 1: kl e^-δ; tv max(1 - δ, 0); neyman 1/(1 + δ); hellinger max(1 - δ/2, 0)^2;
    lecam max((2 - δ)/(2 + δ), 0); pearson, reverse_kl and α > 1: 1."""
    expected = {
        "kl": math.exp(-delta),
        "tv": max(1 - delta, 0.0),
        "neyman": 1 / (1 + delta),
        "hellinger": max(1 - delta / 2, 0.0) ** 2,
        "lecam": max((2 - delta) / (2 + delta), 0.0),
        "pearson": 1.0,
        "reverse_kl": 1.0,
        "alpha(3)": 1.0,
    }
    for name, value in expected.items():
        lower, upper = bc.band(np.array([0.0]), name, delta)
        assert upper[0] == 1.0
        assert lower[0] == pytest.approx(value, rel=1e-14, abs=0.0), name


@pytest.mark.parametrize("delta", [0.5, 2.0])
def test_tv_limit_at_p_zero(delta):
    """§4: q_up = p r_up tends to min(δ, 1) as p -> 0 for TV."""
    _, upper = bc.band(np.array([-60.0]), "tv", delta)
    assert math.exp(-60.0) * upper[0] == pytest.approx(min(delta, 1.0), rel=1e-12)


def test_small_delta_series_needs_small_t():
    """§5: KL at δ = 0.05, p = 1e-4: t = √(2δ(1 - p)/p) = 31.6, r_up = 494.6 against 1 + t = 32.6."""
    p, delta = 1e-4, 0.05
    t = math.sqrt(2 * delta * (1 - p) / p)
    assert round(t, 1) == 31.6 and round(1 + t, 1) == 32.6
    _, upper = bc.band(np.log([p]), "kl", delta)
    assert round(upper[0], 1) == 494.6
    assert round(float(mp.exp(band_log_mp("kl", math.log(p), delta)[1])), 1) == 494.6


def _hellinger_branches(p: mp.mpf, delta: mp.mpf) -> tuple[mp.mpf, mp.mpf]:
    """q of the "-" and "+" branches of Hellinger's closed form, c = max(1 - δ/2, 0)."""
    c = max(1 - delta / 2, mp.mpf(0))
    a, b = c * mp.sqrt(p), mp.sqrt((1 - p) * (1 - c**2))
    return (a - b) ** 2, (a + b) ** 2


@mp.workdps(60)
def test_hellinger_branches_hold_only_where_unsaturated():
    """§6: at p = 0.9, δ = 0.5 the upper bound is saturated (p >= c^2 = 0.5625) while the "+" branch gives
    q = 0.848 < p, inside [0, 1/p]: no clip recovers 1/p; at p = 0.01 the lower bound is saturated while the "-"
    branch gives q = 0.340 > p."""
    delta = mp.mpf("0.5")
    c = 1 - delta / 2
    assert c**2 == mp.mpf("0.5625")
    _, q_plus = _hellinger_branches(mp.mpf("0.9"), delta)
    assert mp.nstr(q_plus, 3) == "0.848"
    _, log_upper, status = bc.band_log(np.log([0.9]), "hellinger", 0.5, return_status=True)
    assert status[0] == bc.Status.SATURATED and log_upper[0] == -math.log(0.9)
    q_minus, _ = _hellinger_branches(mp.mpf("0.01"), delta)
    assert mp.nstr(q_minus, 3) == "0.34"
    log_lower, _ = bc.band_log(np.log([0.01]), "hellinger", 0.5)
    assert log_lower[0] == -np.inf
    # where neither side is saturated (1 - c^2 < p < c^2), the branches are the bounds
    q_minus, q_plus = _hellinger_branches(mp.mpf("0.5"), delta)
    lower, upper = bc.band(np.log([0.5]), "hellinger", 0.5)
    assert float(q_minus / mp.mpf("0.5")) == pytest.approx(lower[0], rel=1e-13)
    assert float(q_plus / mp.mpf("0.5")) == pytest.approx(upper[0], rel=1e-13)


def _alpha_upper_threshold(alpha: mp.mpf, delta: mp.mpf) -> mp.mpf:
    """§6: p*_up = (1 + α(α - 1)δ)^(-1/(α - 1)) for α > 1, max(0, 1 - α(1 - α)δ)^(1/(1 - α)) for 0 < α < 1."""
    if alpha > 1:
        return (1 + alpha * (alpha - 1) * delta) ** (-1 / (alpha - 1))
    return max(mp.mpf(0), 1 - alpha * (1 - alpha) * delta) ** (1 / (1 - alpha))


@pytest.mark.parametrize("alpha, delta", [("0.5", "0.05"), ("0.5", "4.5"), ("0.7", "0.5"), ("0.7", "5"),
                                          ("0.3", "8"), ("2", "0.05"), ("3", "2")])  # fmt: skip
@mp.workdps(60)
def test_alpha_thresholds(alpha, delta):
    """§6: the α-family's upper threshold (max(0, ·) for 0 < α < 1: every p once δ >= 1/(α(1 - α))) and the
    lower one at 1 minus it, against the exact saturation decided by the 60-digit oracle and by band_log."""
    a, d = mp.mpf(alpha), mp.mpf(delta)
    upper_threshold = _alpha_upper_threshold(a, d)
    name = f"alpha({alpha})"
    for p in (mp.mpf("1e-6"), mp.mpf("0.02"), mp.mpf("0.3"), mp.mpf("0.6"), mp.mpf("0.97"), mp.mpf("0.999")):
        x = float(mp.log(p))
        ref_lower, ref_upper = band_log_mp(name, x, float(d), dps=60)
        p_exact = mp.exp(mp.mpf(x))
        assert (ref_upper == -mp.mpf(x)) == (p_exact >= upper_threshold), (name, delta, p)
        assert (ref_lower == mp.ninf) == (p_exact <= 1 - upper_threshold), (name, delta, p)
        log_lower, _, status = bc.band_log(np.array([x]), name, float(d), return_status=True)
        assert (log_lower[0] == -np.inf) == (ref_lower == mp.ninf)
        assert bool(status[0]) == ((ref_upper == -mp.mpf(x)) or ref_lower == mp.ninf)

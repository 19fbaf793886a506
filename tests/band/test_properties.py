r"""Property tests of :func:`bandcore.band_log`, per divergence (the fp64 numerical contract).

Two layers:

* vectorised checks on seeded NumPy draws — 2 000 cases per divergence by default, 100 000 under
  ``-m slow``: lower ≤ 1 ≤ upper ≤ 1/p, monotone in p, nested in δ, mirror symmetry
  :math:`q_{lo}(p) = 1 - q_{up}(1-p)`;
* hypothesis (shrinking, edge finding) with the 50-digit oracle's :math:`g_f`: the returned bound is a root of
  :math:`g_f(p, r) = \delta` to within the contract, :math:`\pm 10^{-11}\max(1, |\log r|)` in :math:`\log r`,
  unless it is saturated (then :math:`g_f \le \delta` there);

plus the small-δ series in :math:`t = \pm\sqrt{2\delta(1-p)/(p f_2)}`: the measured second and
third coefficients converge to :math:`a_2, a_3`, and the third-order truncation error falls like :math:`\delta^2`.
"""

import math
import zlib

import mpmath as mp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bandcore as bc
from bandcore.band import band, band_log
from bandcore.derive.generator_facts.symbolic import facts
from bandcore.oracle import g_mp

DIVERGENCES = [
    *(bc.get_divergence(name) for name in bc.list_divergences() if name != "alpha"),
    *(bc.get_divergence("alpha", alpha=a) for a in (3.0, 0.5, -1.0)),
]
IDS = [d.name for d in DIVERGENCES]
FAST, FULL = 2_000, 100_000


def _draws(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """log p log-uniform in magnitude over [1e-12, 700] (dense near 0 and near -inf), δ log-uniform [1e-8, 10]."""
    rng = np.random.default_rng(seed)
    log_p = -np.exp(rng.uniform(np.log(1e-12), np.log(700.0), count))
    delta = np.exp(rng.uniform(np.log(1e-8), np.log(10.0), count))
    return log_p, delta


def _band_log_per_delta(div, log_p: np.ndarray, deltas: np.ndarray):
    """band_log over (log_p[i], deltas[i]) pairs, vectorised over a few δ values."""
    lower, upper = np.empty_like(log_p), np.empty_like(log_p)
    for d in np.unique(deltas):
        sel = deltas == d
        lower[sel], upper[sel] = band_log(log_p[sel], div, float(d))
    return lower, upper


def _vectorised_properties(div, count: int) -> None:
    log_p, _ = _draws(count, seed=zlib.crc32(div.name.encode()))
    log_p = np.sort(log_p)  # increasing p
    for delta in (1e-6, 0.05, 2.0):
        lower, upper = band_log(log_p, div, delta)
        # lower <= 1 <= upper <= 1/p
        assert np.all(lower <= 0) and np.all(upper >= 0), div.name
        assert np.all(upper <= -log_p * (1 + 1e-15)), div.name
        # monotone: upper non-increasing, lower non-decreasing in p (up to the contract's rounding)
        tol_up = 2e-12 * np.maximum(1, np.abs(upper))
        assert np.all(np.diff(upper) <= tol_up[1:] + tol_up[:-1]), div.name
        finite = np.isfinite(lower)
        assert np.all(np.diff(finite.astype(int)) >= 0), f"{div.name}: lower saturation not a p-threshold"
        lo = lower[finite]
        tol_lo = 2e-12 * np.maximum(1, np.abs(lo))
        assert np.all(np.diff(lo) >= -(tol_lo[1:] + tol_lo[:-1])), div.name
        # nested in δ
        lower2, upper2 = band_log(log_p, div, delta * 1.5)
        assert np.all(upper2 >= upper - 2e-12 * np.maximum(1, upper)), div.name
        assert np.all(lower2 <= lower + 2e-12 * np.maximum(1, np.abs(np.where(finite, lower, 0)))), div.name


def _mirror(div, count: int) -> None:
    rng = np.random.default_rng(7)
    p = np.exp(rng.uniform(np.log(1e-6), np.log(1 - 1e-6), count))
    log_p, log_1mp = np.log(p), np.log1p(-p)  # log(1-p) = log1p(-p)
    for delta in (1e-4, 0.05, 0.5):
        lower, _ = band_log(log_p, div, delta)
        _, upper_mirror = band_log(log_1mp, div, delta)
        q_lo = np.exp(log_p + lower)
        one_minus_q_up = -np.expm1(log_1mp + upper_mirror)  # 1 - q = -expm1(log q)
        scale = np.maximum(1e-300, np.abs(np.expm1(log_1mp + upper_mirror)) * 1e-12 + 1e-12 * q_lo)
        bad = np.abs(q_lo - one_minus_q_up) > 4 * scale + 4e-16
        assert not bad.any(), f"{div.name} δ={delta}: mirror fails at p={p[bad][:3]}"


@pytest.mark.parametrize("div", DIVERGENCES, ids=IDS)
def test_vectorised_properties(div):
    _vectorised_properties(div, FAST)
    _mirror(div, FAST)


@pytest.mark.slow
@pytest.mark.parametrize("div", DIVERGENCES, ids=IDS)
def test_vectorised_properties_full(div):
    _vectorised_properties(div, FULL)
    _mirror(div, FULL)


# ---- g_f(p, bound) = δ with the 50-digit g ------------------------------------------------------------


def _check_root(div, log_p: float, delta: float) -> None:
    lower, upper = (float(v[0]) for v in band_log(np.array([log_p]), div, delta))
    with mp.workdps(50):

        def h(y):
            return g_mp(div, log_p, y) - mp.mpf(delta)

        # inner side clamped at r = 1, outer side at the simplex r = 1/p; upper == -log p is either saturated
        # or the correctly rounded value of a root closer than an ulp to 1/p (KL near p = 1)
        tau = 1e-11 * max(1.0, abs(upper))
        inner, outer = max(upper - tau, 0.0), min(upper + tau, -log_p)
        assert h(inner) <= 0, f"{div.name}: upper above the Band at log p={log_p!r}, δ={delta!r}"
        if upper < -log_p:
            assert h(outer) >= 0, f"{div.name}: upper inside the Band at log p={log_p!r}, δ={delta!r}"
        if lower == -math.inf:
            assert h(mp.ninf) <= 0, f"{div.name}: saturated lower but g(0) > δ at log p={log_p!r}, δ={delta!r}"
        else:
            for allowance in (1e-11, None):  # the contract's looser allowance only where the strict one fails
                allowance = allowance or _near_threshold_allowance(div, log_p, delta, "lower")
                tau = allowance * max(1.0, abs(lower))
                inner, outer = min(lower + tau, 0.0), lower - tau
                if h(outer) >= 0 >= h(inner):
                    break
            assert h(outer) >= 0 >= h(inner), f"{div.name}: lower not a root at {log_p!r}, {delta!r}"


def _near_threshold_allowance(div, log_p: float, delta: float, side: str) -> float:
    """1e-11, or the contract's allowance next to a saturation threshold p* (bandcore.band: 64 eps / eta,
    eta = |p - p*| / p*) where that is larger, e.g. js at p = 1 - 1e-88 and delta 2e-10 below log 2, whose
    threshold is near p = 1."""
    from bandcore.tables.pieces import saturation_threshold

    star = saturation_threshold(div, delta, side, (1e-300, 745.0))
    if star is None or star == "all":
        return 1e-11
    with mp.workdps(50):
        eta = abs(mp.exp(mp.mpf(log_p) + mp.mpf(star)) - 1)  # |p - p*| / p*
    return max(1e-11, 64 * 2.0**-52 / float(eta)) if eta > 0 else math.inf


_LOG_P = st.one_of(
    st.floats(-700.0, -1e-300),
    st.floats(-1e-6, -1e-300),  # p near 1
    st.floats(-700.0, -600.0),  # p near 0
)
_DELTA = st.floats(1e-8, 10.0)


@pytest.mark.parametrize("div", DIVERGENCES, ids=IDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log_p=_LOG_P, delta=_DELTA)
def test_bounds_are_roots_of_g(div, log_p, delta):
    _check_root(div, log_p, delta)


@pytest.mark.slow
@pytest.mark.parametrize("div", DIVERGENCES, ids=IDS)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(log_p=_LOG_P, delta=_DELTA)
def test_bounds_are_roots_of_g_many(div, log_p, delta):
    _check_root(div, log_p, delta)


# ---- small-δ series ---------------------------------------------------------------------------------


def _series_terms(div, p: float, delta: np.ndarray, sign: float):
    """(t, a2, a3) of the small-δ series: r = 1 + t + a2 t^2 + a3 t^3 + O(t^4)."""
    f2, f3, f4 = (float(x) for x in facts(div).derivatives_at_one)
    t = sign * np.sqrt(2 * delta * (1 - p) / (p * f2))
    a2 = -f3 * (1 - 2 * p) / (6 * f2 * (1 - p))
    a3 = (5 * f3**2 * (1 - 2 * p) ** 2 - 3 * f2 * f4 * (1 - 3 * p + 3 * p**2)) / (72 * f2**2 * (1 - p) ** 2)
    return t, a2, a3


@pytest.mark.parametrize("div", [d for d in DIVERGENCES if facts(d).is_smooth_at_one], ids=lambda d: d.name)
@pytest.mark.parametrize("p", [0.08, 0.3])
def test_small_delta_series_order_matches_error_slope(div, p):
    """(r - series_1)/t^2 = a2 + O(t), (r - series_2)/t^3 = a3 + O(t); the order-3 error falls like δ^2."""
    deltas = np.logspace(-7, -3, 9)
    bounds = [band(np.array([np.log(p)]), div, float(d)) for d in deltas]
    lower, upper = (np.array([float(b[side][0]) for b in bounds]) for side in (0, 1))
    for sign, exact in ((1.0, upper), (-1.0, lower)):
        t, a2, a3 = _series_terms(div, p, deltas, sign)
        small = abs(t[0])  # ≈ 1e-3: a wrong coefficient shows as a gap far above O(t)
        gap2 = abs((exact[0] - 1 - t[0]) / t[0] ** 2 - a2)
        assert gap2 <= (1 + abs(a3)) * small, (div.name, sign, "a2", gap2, a2)
        gap3 = abs((exact[0] - 1 - t[0] - a2 * t[0] ** 2) / t[0] ** 3 - a3)
        assert gap3 <= 10 * small + 1e-12 / small**3, (div.name, sign, "a3", gap3, a3)
        error3 = np.abs(exact - (1 + t + a2 * t**2 + a3 * t**3))[4:]  # δ >= 1e-5: above rounding
        if np.all(error3 < 1e-13):  # exact at third order (e.g. Pearson: r = 1 ± t)
            continue
        slope = np.polyfit(np.log(deltas[4:]), np.log(error3), 1)[0]
        assert slope > 2.0 - 0.1, (div.name, sign, slope)  # O(t^4) = O(δ^2)


def test_tv_band_is_exactly_linear_in_delta():
    p = np.array([0.3, 0.5, 0.7])
    lower, upper = band(np.log(p), "tv", 0.05)
    np.testing.assert_allclose(upper, 1 + 0.05 / p, rtol=1e-14)
    np.testing.assert_allclose(lower, 1 - 0.05 / p, rtol=1e-14)

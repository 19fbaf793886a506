"""Tables split at a singular saturation threshold (js, reverse KL, the α-family with 0 < α < 1) and logarithmic
tails (generators growing like u log u): certified against the 50-digit oracle next to the threshold, down to
the float64 next to it, and in the tails; files round-trip; a user generator builds."""

from __future__ import annotations

import numpy as np
import pytest

from bandcore import BandTable, Divergence
from bandcore.oracle import reference_band_log
from bandcore.tables import rel_log_error
from bandcore.tables.threshold import SPLIT_LOWER, SPLIT_UPPER, SplitBound


@pytest.fixture(scope="module")
def js() -> BandTable:
    return BandTable.shipped("js", 0.05)


def _near_threshold(L_star: float, side: str) -> np.ndarray:
    """L at relative distances 1e-2 .. 1e-15 from L* on the unsaturated side, and the two floats next to it."""
    eta = 10.0 ** -np.arange(2, 16)
    if side == "lower":
        first = np.nextafter(L_star, 0.0)
        return np.concatenate([L_star * (1 - eta), [first, np.nextafter(first, 0.0)]])
    first = np.nextafter(L_star, np.inf)
    return np.concatenate([L_star * (1 + eta), [first, np.nextafter(first, np.inf)]])


def test_js_is_split_at_both_thresholds(js):
    assert js.lower.kind == SPLIT_LOWER and js.upper.kind == SPLIT_UPPER
    assert 0 < js.max_rel_error <= 1e-7
    # near parts refine geometrically towards the threshold: cells of the first octave are far smaller than L*
    for bound in (js.lower, js.upper):
        assert bound.near.knots[0] < 1e-15 * bound.threshold
        assert 0.9 < bound.gamma < 1.1  # u ~ lambda / log(1/lambda): exponent 1 up to the logarithm


@pytest.mark.parametrize("side", ["lower", "upper"])
def test_js_next_to_the_threshold_against_the_oracle(js, side):
    """Where r ~ λ/log(1/λ): within the certificate at every distance, down to the float64 next to L*."""
    bound = js.lower if side == "lower" else js.upper
    index = 0 if side == "lower" else 1
    L = _near_threshold(bound.threshold, side)
    exact = reference_band_log("js", -L, 0.05)[index]
    approx = js.log(-L)[index]
    assert np.all(np.isfinite(approx))
    assert rel_log_error(approx, exact).max() <= js.max_rel_error
    # the saturated side stays exact
    L_sat = bound.threshold * (1 + np.array([0.0, 1e-12, 1e-3]) * (1 if side == "lower" else -1))
    lo, up = js.log(-L_sat)
    assert np.all(np.isneginf(lo)) if side == "lower" else np.array_equal(up, L_sat)


@pytest.mark.parametrize("name", ["tv", "pearson", "hellinger", "lecam", "alpha(0.5)"])
@pytest.mark.parametrize("delta", [0.01, 0.2])
def test_saturating_lower_bounds_are_split_and_exact_next_to_the_threshold(name, delta):
    """r falls to 0 at the lower threshold, linearly (tv, pearson, lecam) or like λ² (hellinger, alpha(0.5)):
    the shipped 1-D tables split that bound there, so log r stays within the certificate down to the float64
    next to L* (a plain cubic in r erred by up to 4.5e-2 there, against a certificate of 5e-8)."""
    table = BandTable.shipped(name, delta)
    assert isinstance(table.lower, SplitBound) and table.lower.kind == SPLIT_LOWER
    L = _near_threshold(table.lower.threshold, "lower")
    exact = reference_band_log(name, -L, delta)[0]
    approx = table.log(-L)[0]
    assert np.all(np.isfinite(approx))
    assert rel_log_error(approx, exact).max() <= table.max_rel_error


def test_split_table_round_trips_and_backends_agree(js, tmp_path):
    log_p = -np.concatenate([_near_threshold(js.lower.threshold, "lower"), np.logspace(-300, 3, 200)])
    for suffix in (".npz", ".json"):
        back = BandTable.load(js.save(tmp_path / f"js{suffix}"))
        assert isinstance(back.lower, SplitBound) and isinstance(back.upper, SplitBound)
        for got, ref in zip(back.log(log_p), js.log(log_p), strict=True):
            np.testing.assert_array_equal(got, ref)
    ref = js.log(log_p, backend="numpy")
    for got, want in zip(js.log(log_p, backend="numba"), ref, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)


@pytest.mark.parametrize(("name", "powers"), [("js", (1, 1)), ("reverse_kl", (1, 1)), ("tv", (1, None)),
                                            ("hellinger", (2, None)), ("alpha(0.7)", (1, None))])
def test_near_parts_store_u_over_an_integer_power_of_lambda(name, powers):
    """Where the measured exponent is within 0.5 of 1 or 2 the near part stores H = u / lambda^k (gamma = k in
    the table; alpha(0.7), measured 10/7: k = 1): the Numba kernel then reads a lower bound's ratios with no
    transcendental.  Its ratios equal the NumPy reader's log bounds' exp, next to both thresholds and elsewhere."""
    table = BandTable.shipped(name, 0.05)
    for bound, power in zip((table.lower, table.upper), powers, strict=True):
        assert getattr(bound, "near_power", None) == power
        if power:
            assert bound.gamma == power
    L = np.concatenate([_near_threshold(b.threshold, side) for b, side in ((table.lower, "lower"),
                                                                           (table.upper, "upper"))
                        if isinstance(b, SplitBound)] + [np.logspace(-300, 2.8, 3000)])  # fmt: skip
    ratios = table(-L, backend="numba")
    for got, log_want in zip(ratios, table.log(-L, backend="numpy"), strict=True):
        assert np.array_equal(got == 0, np.isneginf(log_want))
        with np.errstate(divide="ignore"):
            assert rel_log_error(np.log(got), log_want).max() <= 1e-15  # r itself, or the exp of its log


def test_near_power_of_the_measured_exponent():
    from bandcore.tables.threshold import near_power_of

    gammas = (1.0, 1.019, 0.96, 2.0, 2.04, 1.429, 0.5, 2.49, 0.49, 2.5, 3.0)
    assert [near_power_of(g) for g in gammas] == [1, 1, 1, 2, 2, 1, 1, 2, 0, 0, 0]


def test_a_near_part_storing_h_is_the_exp_of_g():
    """H = u / lambda^k is e^G of the G-form samples at gamma = k, and its slope e^G dG/dlambda."""
    from bandcore.tables.near import near_samples
    from bandcore.tables.tabulated import exact_solver
    from bandcore.tables.threshold import threshold_dd

    div = BandTable.shipped("js", 0.05).divergence
    star, _, _ = threshold_dd(div, 0.05, "lower", BandTable.shipped("js", 0.05).lower.threshold)
    lam = np.array([1e-20, 1e-9, 1e-3, 0.5])
    g, dg = near_samples(div, 0.05, "lower", star, float(star), 1.0, lam, exact_solver(), {})
    h, dh = near_samples(div, 0.05, "lower", star, float(star), 1.0, lam, exact_solver(), {}, power=1)
    np.testing.assert_allclose(h, np.exp(g), rtol=1e-15)
    np.testing.assert_allclose(dh, np.exp(g) * dg, rtol=1e-15)


def test_alpha_with_a_power_law_threshold_builds():
    """α = 0.7: r ~ λ^(1/0.7) at the lower threshold (refused before the split); the measured γ is that exponent,
    and the near part stores H = r / λ (k = 1, within 0.5 of γ)."""
    from bandcore.tables.threshold import gamma_of, threshold_dd

    table = BandTable.shipped("alpha(0.7)", 0.1)
    star, _, _ = threshold_dd(table.divergence, 0.1, "lower", table.lower.threshold)
    assert abs(gamma_of(table.divergence, 0.1, "lower", star) - 1 / 0.7) < 0.01
    assert table.lower.kind == SPLIT_LOWER and table.lower.near_power == 1 == table.lower.gamma
    L = _near_threshold(table.lower.threshold, "lower")
    exact = reference_band_log("alpha(0.7)", -L, 0.1)[0]
    assert rel_log_error(table.log(-L)[0], exact).max() <= table.max_rel_error


@pytest.fixture(scope="module")
def jeffreys() -> BandTable:
    return BandTable.build(Divergence.from_expression("(u - 1)*log(u)"), 0.05)


@pytest.mark.slow  # 11 s: builds a user generator's table
def test_user_generator_with_logarithmic_tails(jeffreys):
    """(u - 1) log u: log r_lo -> 0 like 1/log(1/L) as p -> 1 and log r_up ~ L - log L as p -> 0, neither
    reachable by an end value or an end tangent; both are tail modes fitted to the oracle."""
    assert 0 < jeffreys.max_rel_error <= 1e-7
    assert jeffreys.lower.left_tail is not None and jeffreys.upper.right_tail is not None
    L = np.array([0.0, 5e-324, 1e-315, 2.0**-1022, 1e-250, 2.0**-121, 1e-30, 1e-3, 0.7, 30.0, 400.0, 679.0, 690.0,
                  1500.0, 2e3])  # fmt: skip
    exact = reference_band_log(jeffreys.divergence, -L, 0.05)
    for approx, ref in zip(jeffreys.log(-L), exact, strict=True):
        assert rel_log_error(approx, ref).max() <= jeffreys.max_rel_error
    assert jeffreys.recertify(1, seed=5) <= jeffreys.max_rel_error  # one random point per cell, and the tails


@pytest.mark.slow  # 15 s; determinism is also covered fast by test_tables_determinism and check-shipped
def test_split_build_reproduces_the_shipped_table(tmp_path):
    """The 50-digit solves and the float64 solver are deterministic: a fresh build is the shipped file (built in
    another process, by `bandcore table regenerate`), byte for byte on a CPU whose NumPy exp and log round as the
    builder's did; on another (with AVX-512 or without: they differ in the last bit) the same grids, thresholds
    and certificate, and every stored value and slope within 1e-9 as the freshness check measures it (a slope times
    its cell's width, an upper bound's near part in u = 1 - p r_up)."""
    from bandcore.tables.formats import SHIPPED_DIR, shipped_name
    from bandcore.tables.shipped import _differences, _upper_gap

    shipped_path = SHIPPED_DIR / shipped_name("js", 0.2)
    path = BandTable.build("js", 0.2).save(tmp_path / "js.npz")
    if path.read_bytes() == shipped_path.read_bytes():
        return
    fresh, shipped = BandTable.load(path), BandTable.load(shipped_path)
    assert fresh.max_rel_error == shipped.max_rel_error
    for side in ("lower", "upper"):
        a, b = getattr(fresh, side), getattr(shipped, side)
        assert (a.star_hi, a.star_lo, a.gamma, a.near_power) == (b.star_hi, b.star_lo, b.gamma, b.near_power)
        for part_a, part_b, near in ((a.far, b.far, False), (a.near, b.near, True)):
            np.testing.assert_array_equal(part_a.knots, part_b.knots)
            stored = [(part.values, part.slopes) for part in (part_a, part_b)]
            if near and side == "upper":  # in u = 1 - p r_up (the bound moves by u dH/H)
                stored = [_upper_gap(part_a.knots, a.gamma, *pair, a.near_power) for pair in stored]
            idx = np.arange(part_a.knots.size)
            assert _differences(part_a.knots, idx, *stored[0], *stored[1]) <= 1e-9, (side, near)

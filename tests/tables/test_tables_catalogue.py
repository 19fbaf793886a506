"""Tables for the catalogue: every divergence the kernel can tabulate agrees with the 50-digit oracle at random
points and next to its saturation thresholds (a singular threshold splits the table there); names of the
α-family and of formulas round-trip through files; regressions of the builds that used to fail."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bandcore import BandTable
from bandcore.divergences import resolve
from bandcore.oracle import reference_band_log
from bandcore.tables import rel_log_error
from bandcore.tables.formats import file_stem, shipped_name
from bandcore.tables.pieces import bisection_band_log, log_p_of_x, pieces, saturation_threshold
from bandcore.tables.shape import LOG_NEG_LOG_R, LOG_R_LOWER, kernel_kinds, lower_tail_kind, threshold_exponent
from bandcore.tables.shipped import SHIPPED_NAMES
from bandcore.tables.threshold import SplitBound

#: tables checked against the oracle: shipped ones (loaded) and fresh builds of the rest
SHIPPED_CASES = [(name, (0.02, 0.2, 0.05, 0.2, 0.02, 0.1)[i % 6]) for i, name in enumerate(SHIPPED_NAMES)]
FRESH_CASES = [("alpha(3)", 0.1), ("(u - 1)**4", 0.05)]
KIND3_CASES = [("neyman", 0.05), ("alpha(-1)", 0.2)]  # need the kernel's "log r" kind for a lower bound
HAS_KIND3 = LOG_R_LOWER in kernel_kinds()


@pytest.fixture(scope="module")
def tables() -> dict[tuple[str, float], BandTable]:
    built = {case: BandTable.shipped(*case) for case in SHIPPED_CASES}
    fresh = FRESH_CASES + (KIND3_CASES if HAS_KIND3 else [])
    built.update({case: BandTable.build(*case) for case in fresh})
    return built


def _random_log_p(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return log_p_of_x(np.concatenate([rng.uniform(-25, 25, 5), [rng.uniform(-300, -100)]]))


def _threshold_log_p(table: BandTable, name: str, delta: float) -> np.ndarray:
    """log p at L* (1 ± η) for each saturated side: just inside and just outside the saturated range.

    η = 1e-9, except next to a lower threshold where r ~ |L - L*|^2 (Hellinger, α = ½): there the kernel's cubic,
    evaluated in Horner form from the cell's left knot, cancels down to r ~ 1e-18 with an absolute error
    ~ 1e-16 r(left knot), i.e. a relative one ~ 1e-16 (w/|L - L*|)^2 (3e-7 at η = 1e-9 in the measure), so
    η = 1e-8 there (see bandcore.tables.shape)."""
    ends, nearest = [], []
    if table.upper.saturated_left:
        if isinstance(table.upper, SplitBound):  # split at the threshold: down to the float next to it
            L_star = table.upper.threshold
            ends.append((L_star, 1e-14))
            nearest.append(np.nextafter(L_star, np.inf))
        else:
            ends.append((table.upper.knots[0], 1e-9))
    if table.lower.saturated_right:
        if isinstance(table.lower, SplitBound):
            L_star = table.lower.threshold
            ends.append((L_star, 1e-14))
            nearest.append(np.nextafter(L_star, 0.0))
        else:
            L_star = table.lower.knots[-1]
            gamma = threshold_exponent(resolve(name), delta, "lower", L_star)
            ends.append((L_star, 1e-9 if gamma < 1.5 else 1e-8))
    return -np.array([L * (1 + s * eta) for L, eta in ends for s in (-1, 1)] + nearest)


@pytest.mark.parametrize("case", SHIPPED_CASES + FRESH_CASES + (KIND3_CASES if HAS_KIND3 else []),
                         ids=lambda c: f"{c[0]}@{c[1]}")  # fmt: skip
def test_table_agrees_with_the_oracle(tables, case):
    table = tables[case]
    name, delta = case
    assert 0 < table.max_rel_error <= 1e-7
    log_p = np.concatenate([_random_log_p(len(name) + int(delta * 100)), _threshold_log_p(table, name, delta)])
    exact = reference_band_log(name, log_p, delta)
    for approx, ref in zip(table.log(log_p), exact, strict=True):
        assert np.array_equal(np.isneginf(approx), np.isneginf(ref))  # saturated lower bound: exactly r = 0
        assert rel_log_error(approx, ref).max() <= table.max_rel_error


@pytest.mark.parametrize("case", SHIPPED_CASES, ids=lambda c: f"{c[0]}@{c[1]}")
def test_thresholds_are_the_grid_ends(tables, case):
    """The saturation thresholds (50-digit) end the grids, and the saturated side is exact on either side."""
    table = tables[case]
    name, delta = case
    for side, bound, edge in (("upper", table.upper, 0), ("lower", table.lower, -1)):
        threshold = saturation_threshold(resolve(name), delta, side, (2.0**-120, 680.0))
        if threshold is None:
            continue
        assert (bound.threshold if isinstance(bound, SplitBound) else bound.knots[edge]) == threshold
        L = threshold * (1 + np.array([0.0, 1e-12, 1e-6]) * (1 if side == "lower" else -1))
        lo, up = table.log(-L)
        if side == "lower":
            assert np.all(np.isneginf(lo))
        else:
            assert np.array_equal(up, L)


# ---- what cannot be tabulated is refused before anything is built, with the reason ------------------------------


@pytest.mark.parametrize("name", ["js", "reverse_kl", "alpha(0.7)", "u*log(u) - u + 1 + (u - 1)**2"])
def test_singular_threshold_is_measured_with_the_reason(name):
    """No function of L alone is smooth at these thresholds (the tables split there: test_tables_threshold)."""
    div = resolve(name)
    L_star = saturation_threshold(div, 0.05, "lower", (2.0**-120, 680.0))
    with pytest.raises(ValueError, match=r"saturation threshold L\* = .* gamma = .* not a constant integer"):
        threshold_exponent(div, 0.05, "lower", L_star)


@pytest.mark.parametrize("name", ["neyman", "alpha(-1)"])
def test_power_law_lower_tail_needs_log_r(name):
    """log r_lo = -(L + log(δ/c))/k as p -> 0: kind 3 (log r) where the kernel has it, else a clear refusal."""
    if HAS_KIND3:
        assert lower_tail_kind(resolve(name), 0.05) == LOG_R_LOWER
    else:
        with pytest.raises(ValueError, match="log r is linear in L"):
            BandTable.build(name, 0.05)


def test_exponential_lower_tail_keeps_log_neg_log_r():
    assert lower_tail_kind(resolve("kl"), 0.05) == LOG_NEG_LOG_R


def test_kernel_has_the_three_original_kinds():
    assert {0, 1, 2} <= kernel_kinds()


# ---- regressions of the builds that failed -----------------------------------------------------------------------


def test_lecam_exact_solver_far_in_the_tail():
    """Le Cam's closed form expm1(y)^2/(e^y + 1) overflowed for log r > 355: the upper bound was off by up to 49 %."""
    log_p = np.array([-360.0, -500.0, -680.0])
    _, upper = bisection_band_log(log_p, "lecam", 0.05)
    _, exact = reference_band_log("lecam", log_p, 0.05)
    assert rel_log_error(upper, exact).max() <= 1e-14


@pytest.mark.parametrize(("name", "delta"), [("hellinger", 0.02), ("hellinger", 0.1), ("alpha(0.5)", 0.01)])
def test_upper_slope_at_a_square_root_threshold_is_finite(name, delta):
    """f'(0) = -inf (Hellinger-type): the one-sided slope at the threshold is the limit dy/dL = 1 (was NaN)."""
    threshold = saturation_threshold(resolve(name), delta, "upper", (2.0**-120, 680.0))
    L = np.array([threshold])
    slope = pieces(resolve(name)).slope_in_L(L, L.copy(), kink=True)
    assert slope[0] == pytest.approx(1.0, rel=1e-12)


# ---- names -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "stem"), [("kl", "kl"), ("reverse_kl", "reverse_kl"), ("alpha(0.5)", "alpha0.5"),
                                             ("alpha(-1)", "alpha-1"), ("alpha(1e-05)", "alpha1e-05")])  # fmt: skip
def test_file_stems_of_catalogue_names(name, stem):
    assert file_stem(name) == stem
    assert shipped_name(name, 0.05) == f"{stem}_delta0.05.npz"


@pytest.mark.parametrize("name", ["u*log(u)/2", "../../etc/passwd", "(u - 1)**4", "a b\\c:d"])
def test_file_stems_of_other_names_are_safe(name):
    stem = file_stem(name)
    assert stem.startswith("user-") and len(stem) == 21
    assert all(c in "abcdefghijklmnopqrstuvwxyz0123456789-" for c in stem)


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_alpha_and_formula_names_round_trip(tables, tmp_path, suffix):
    for case in [("alpha(3)", 0.1), ("(u - 1)**4", 0.05), ("alpha(0.5)", dict(SHIPPED_CASES)["alpha(0.5)"])]:
        table = tables[case]
        path = table.save(tmp_path / f"{file_stem(table.divergence_name)}{suffix}")
        loaded = BandTable.load(path)
        assert loaded.divergence == resolve(case[0]) and loaded.divergence_name == table.divergence_name
        for a, b in zip(loaded.log(np.array([-3.0, -0.01])), table.log(np.array([-3.0, -0.01])), strict=True):
            np.testing.assert_array_equal(a, b)
    assert BandTable.shipped("alpha(0.5)", 0.1).divergence.name == "alpha(0.5)"


def test_shipped_alpha_is_hellinger_at_half_delta():
    """α = ½ is 2·Hellinger, so its Band at δ is Hellinger's at δ/2: two independent builds agree."""
    log_p = log_p_of_x(np.linspace(-20, 20, 401))
    for a, b in zip(BandTable.shipped("alpha(0.5)", 0.02).log(log_p), BandTable.shipped("hellinger", 0.01).log(log_p),
                    strict=True):  # fmt: skip
        assert np.array_equal(np.isneginf(a), np.isneginf(b))
        assert rel_log_error(a, b).max() <= 2e-7
    half, hellinger = resolve("alpha(0.5)"), resolve("hellinger")
    assert math.isclose(saturation_threshold(half, 0.02, "lower", (1e-30, 680.0)),
                        saturation_threshold(hellinger, 0.01, "lower", (1e-30, 680.0)), rel_tol=1e-14)  # fmt: skip

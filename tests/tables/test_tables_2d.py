"""2-D tables: every shipped one certified against the 50-digit oracle at random δ of its range; each bound
that saturates is split at its exact threshold L*(δ) and checked next to it, down to the float64 next to L*;
``at(δ)`` is a 1-D table at that δ; files round-trip; bad ranges are refused clearly."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bandcore import BandTable, Divergence
from bandcore.oracle import reference_band_log
from bandcore.tables import BandTable2D, rel_log_error
from bandcore.tables.shipped import SHIPPED, SHIPPED_DELTA_RANGE
from bandcore.tables.threshold import SPLIT_LOWER, SPLIT_UPPER, SplitBound

#: every shipped 2-D table
TWO_D = [name for name, delta, _ in SHIPPED if isinstance(delta, tuple)]


@pytest.fixture(scope="module", params=TWO_D)
def table(request) -> BandTable2D:
    return BandTable.shipped(request.param, SHIPPED_DELTA_RANGE)


def _saturates(div: Divergence, delta: float) -> tuple[bool, bool]:
    """Whether the lower bound reaches 0 for tiny p and the upper bound reaches 1/p at p = exp(-0.01) (the
    oracle; closer to p = 1, an upper bound that never saturates, like KL's, rounds to 1/p)."""
    lower, upper = reference_band_log(div, np.array([-700.0, -0.01]), delta)
    return bool(np.isneginf(lower[0])), bool(upper[1] == 0.01)


def _next_to(L_star: float, side: str) -> np.ndarray:
    """L at relative distances 1e-3 .. 1e-15 from L* on the unsaturated side and the two floats next to it;
    the float next to L* on the saturated side and L* itself (saturated)."""
    eta = 10.0 ** -np.arange(3, 16, 3)
    away = 0.0 if side == "lower" else math.inf
    first = np.nextafter(L_star, away)
    inside = np.nextafter(L_star, math.inf if side == "lower" else 0.0)
    step = -1 if side == "lower" else 1
    return np.concatenate([L_star * (1 + step * eta), [first, np.nextafter(first, away), L_star, inside]])


def _deltas(seed: int, n: int) -> np.ndarray:
    lo, hi = (math.log(d) for d in SHIPPED_DELTA_RANGE)
    return np.exp(np.random.default_rng(seed).uniform(lo, hi, n))


def test_2d_tables_split_exactly_the_saturating_bounds(table):
    assert 0 < table.max_rel_error <= table.target == 1e-7
    one = table.at(0.05)
    for side, kind, saturates in zip(("lower", "upper"), (SPLIT_LOWER, SPLIT_UPPER),
                                     _saturates(table.divergence, 0.05), strict=True):  # fmt: skip
        bound = getattr(one, side)
        assert isinstance(bound, SplitBound) == saturates, side
        assert not saturates or bound.kind == kind


def test_2d_against_the_oracle_next_to_both_thresholds(table):
    """At random δ (between the Chebyshev nodes): a spread of p from 1 - 1e-30 to 1e-300 and each threshold,
    down to the float64 next to L* on each side, against the 50-digit oracle; the saturated side is exact."""
    for delta in _deltas(TWO_D.index(table.divergence_name), 2):
        one = table.at(float(delta))
        L = [np.array([1e-30, 1e-15]), np.logspace(-9, 2.7, 9), np.array([680.0, 690.0])]
        for side in ("lower", "upper"):
            bound = getattr(one, side)
            if isinstance(bound, SplitBound):
                L.append(_next_to(bound.threshold, side))
        L = np.concatenate(L)
        exact = reference_band_log(table.divergence, -L, float(delta))
        for approx, ref in zip(table.log(-L, float(delta)), exact, strict=True):
            assert rel_log_error(approx, ref).max() <= table.max_rel_error, (delta, L[np.argmax(approx != ref)])
        if isinstance(one.lower, SplitBound):
            assert np.isneginf(table.log(-np.array([one.lower.threshold]), float(delta))[0][0])
        if isinstance(one.upper, SplitBound):
            assert table.log(-np.array([one.upper.threshold]), float(delta))[1][0] == one.upper.threshold


def test_2d_at_delta_is_the_1d_table(table):
    """at(δ) agrees with the shipped 1-D table at a δ of the range, within the two certificates, down to the
    float64 next to each threshold."""
    one_d, at = BandTable.shipped(table.divergence_name, 0.05), table.at(0.05)
    L = [np.logspace(-30, 2.8, 400)]
    for side in ("lower", "upper"):
        bound = getattr(at, side)
        if isinstance(bound, SplitBound):
            L.append(_next_to(bound.threshold, side)[:-2])
    L = np.concatenate(L)
    for a, b in zip(at.log(-L), one_d.log(-L), strict=True):
        assert rel_log_error(a, b).max() <= table.max_rel_error + one_d.max_rel_error


def test_split_2d_round_trips(tmp_path):
    table = BandTable.shipped("tv", SHIPPED_DELTA_RANGE)
    log_p = -np.logspace(-20, 2.8, 300)
    for suffix in (".npz", ".json"):
        back = BandTable2D.load(table.save(tmp_path / f"h{suffix}"))
        assert back.n_knots == table.n_knots
        for got, ref in zip(back.log(log_p, 0.033), table.log(log_p, 0.033), strict=True):
            np.testing.assert_array_equal(got, ref)


def test_2d_refuses_bad_ranges_clearly():
    table = BandTable.shipped("tv", SHIPPED_DELTA_RANGE)
    with pytest.raises(ValueError, match="outside this table's range"):
        table.at(0.5)
    with pytest.raises(ValueError, match="lo < hi"):
        BandTable.build("tv", (0.2, 0.01))
    with pytest.raises(ValueError, match="saturates on all of L"):
        BandTable.build("tv", (0.5, 2.0))  # tv's lower bound is 0 for every p once delta >= 1
    with pytest.raises(ValueError, match=r"threshold moves too far .* for 24 pieces .*build narrower ranges"):
        BandTable.build("tv", (1e-8, 0.999))  # L* from 18.4 to 0.001: refused before any table work


@pytest.mark.slow  # ~20 s
def test_user_generator_with_logarithmic_tails_builds_a_2d_table():
    """(u - 1) log u never saturates but needs logarithmic tails, fitted at each δ.  (A saturating user
    generator: tests/tables/test_tables_determinism.py.)"""
    div = Divergence.from_expression("(u - 1)*log(u)")
    table = BandTable2D.build(div, (0.05, 0.052), target=1e-6)
    assert 0 < table.max_rel_error <= 1e-6
    assert table.lower.tails[0] and table.upper.tails[1]
    delta = 0.0511
    L = np.array([0.0, 5e-324, 1e-300, 1e-30, 1e-6, 0.3, 3.0, 30.0, 300.0, 679.0, 700.0, 2e3])
    for approx, ref in zip(table.log(-L, delta), reference_band_log(div, -L, delta), strict=True):
        assert rel_log_error(approx, ref).max() <= table.max_rel_error

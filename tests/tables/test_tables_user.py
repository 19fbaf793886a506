"""User generators outside the catalogue: 1-D tables (δ = 0.05) and 2-D tables (δ in [0.01, 0.2]) certified to
1e-7 and checked against the 50-digit oracle at random points, down to the float64 next to every saturation
threshold, and far out in the tails (exponential growth: r linear in L beyond the grid).

CI cost: the fast part (nine 1-D builds, ~130 oracle points each, one CLI build) and the slow part (two 2-D builds
over δ in [0.04, 0.06]) are listed by ``--durations`` in CI's log.
"""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
from tiers import sampled

from bandcore import BandTable
from bandcore.derive.generator_facts.mpmath_g import g_ratio
from bandcore.divergences import resolve
from bandcore.oracle import reference_band_log
from bandcore.tables import BandTable2D, rel_log_error
from bandcore.tables.tabulated import RIGHT_LINEAR, TabulatedBound
from bandcore.tables.threshold import SplitBound

DELTA = 0.05
MAX2 = "max(u - 2, 0)"
HUBER = "where(abs(u-1) < 1, (u-1)**2/2, abs(u-1) - 1/2)"
#: generators that grow exponentially (cosh, exp), grow linearly through an exponential (log cosh, softplus:
#: cosh(u - 1) overflows at u > 711 unless rewritten), have a fractional power at u = 1 (|u - 1|^1.5), a kink of
#: f at u = 1 only (|u - 1|^3, max(u - 1, 0)^2: r and s never reach 1 on a bound, so the bounds have no kink)
GENERATORS = ["cosh(u-1) - 1", "exp(u-1) - u", "log(cosh(u-1))", "log(1+exp(u-1)) - log(2) - (u-1)/2",
              "abs(u-1)**1.5", "abs(u-1)**3", "max(u-1, 0)**2", MAX2, HUBER]  # fmt: skip
#: kinks of f away from u = 1: a bound has a kink where r or s crosses one (f'' jumps for Huber; for max(u - 2, 0)
#: r_up = 2 + delta/p meets 1/p exactly at the saturation threshold, so its kink is that threshold)
KINKS = {MAX2: [2.0], HUBER: [2.0, 0.0]}
#: far out on the right: beyond the grid (680) and the certificate's last tail point (2000)
FAR_RIGHT = np.array([681.0, 700.0, 1e3, 2e3, 5e3, 1e4])


class _Tables(dict):
    """Each generator's table, built on first use (the fast tier builds only the ones it samples)."""

    def __missing__(self, generator: str) -> BandTable:
        self[generator] = BandTable.build(generator, DELTA)
        return self[generator]


@pytest.fixture(scope="module")
def tables() -> dict[str, BandTable]:
    return _Tables()


def _thresholds(bound) -> list[tuple[float, str]]:
    """(L*, side) of a bound's saturation threshold, if it has one."""
    if isinstance(bound, SplitBound):
        return [(bound.threshold, "lower" if bound.kind == 4 else "upper")]
    if bound.saturated_left:
        return [(float(bound.knots[0]), "upper")]
    if bound.saturated_right:
        return [(float(bound.knots[-1]), "lower")]
    return []


def _next_to(L_star: float, side: str) -> np.ndarray:
    """L at relative distances 1e-2 .. 1e-15 from L* on the unsaturated side, and the two floats next to it."""
    eta = 10.0 ** -np.arange(2, 16)
    toward = 0.0 if side == "lower" else np.inf
    first = np.nextafter(L_star, toward)
    return np.concatenate([L_star * (1 - eta if side == "lower" else 1 + eta), [first, np.nextafter(first, toward)]])


def _kink_L(generator: str, delta: float, u_kink: float) -> list[float]:
    """The L where a bound's r or s equals ``u_kink`` (50 digits): roots in L of g_f(p, r_k) = delta with
    r_k = u_kink (r crosses it) or r_k = (1 - (1 - p) u_kink)/p (s crosses it), kept where the oracle's bound is
    r_k there."""
    out, div = [], resolve(generator)
    with mp.workdps(50):
        def h(L, through_s):
            p = mp.exp(-L)
            r = (1 - (1 - p) * u_kink) / p if through_s else mp.mpf(u_kink)
            return None if r < 0 else g_ratio(div, p, r) - delta, r

        for through_s in (False, True):
            grid = [mp.mpf(x) for x in np.geomspace(1e-6, 700.0, 60)]
            values = [h(L, through_s)[0] for L in grid]
            for a, b, ha, hb in zip(grid, grid[1:], values, values[1:], strict=False):
                if ha is None or hb is None or (ha > 0) == (hb > 0):
                    continue
                for _ in range(200):
                    mid = (a + b) / 2
                    a, b = (mid, b) if (h(mid, through_s)[0] > 0) == (ha > 0) else (a, mid)
                L_k = float((a + b) / 2)
                r_k = float(h(mp.mpf(L_k), through_s)[1])
                if r_k <= 0:  # r = 0: a saturation threshold, checked as one
                    continue
                exact = reference_band_log(generator, -np.array([L_k]), delta)
                if any(abs(float(e[0]) - np.log(r_k)) < 1e-6 for e in exact if np.isfinite(e[0])):
                    out.append(L_k)
    return out


def _points(table: BandTable, seed: int, generator: str = "", delta: float = DELTA) -> np.ndarray:
    """100 random L (log-uniform over [1e-12, 700]), the floats next to every threshold and kink, far right."""
    rng = np.random.default_rng(seed)
    L = [np.exp(rng.uniform(np.log(1e-12), np.log(700.0), 100)), FAR_RIGHT]
    for bound in (table.lower, table.upper):
        L += [_next_to(L_star, side) for L_star, side in _thresholds(bound)]
    for u_kink in KINKS.get(generator, []):
        for L_k in _kink_L(generator, delta, u_kink):
            L += [_next_to(L_k, "lower"), _next_to(L_k, "upper")]
    return np.concatenate(L)


def _check_against_oracle(table: BandTable, generator: str, delta: float, L: np.ndarray) -> None:
    exact = reference_band_log(generator, -L, delta)
    approx = table.log(-L)
    for a, e in zip(approx, exact, strict=True):
        finite = np.isfinite(e)
        assert np.array_equal(np.isfinite(a), finite), L[np.isfinite(a) != finite][:5]
        worst = rel_log_error(a[finite], e[finite]).max()
        assert worst <= table.max_rel_error, (generator, delta, worst)


@pytest.mark.parametrize("generator", sampled(GENERATORS, fast=["exp(u-1) - u", "abs(u-1)**1.5", HUBER]))
def test_user_generator_1d_is_certified_against_the_oracle(tables, generator):
    table = tables[generator]
    assert 0 < table.max_rel_error <= 1e-7
    L = _points(table, seed=len(generator), generator=generator)
    if generator in KINKS:
        assert len(L) > 100 + len(FAR_RIGHT) + 2 * 16 * len(KINKS[generator]) - 1
    _check_against_oracle(table, generator, DELTA, L)


@pytest.mark.parametrize("generator", sampled(["cosh(u-1) - 1", "exp(u-1) - u"], fast=["exp(u-1) - u"]))
def test_exponential_growth_has_a_linear_right_tail_on_every_backend(tables, generator):
    """f growing like e^u: r_up ~ L + log(2 delta) + 1, so log r is not linear in L beyond the grid; the table
    continues r = K + nu L there, and the Numba kernel reads it as the NumPy one does."""
    upper = tables[generator].upper
    far = upper.far if isinstance(upper, SplitBound) else upper
    assert isinstance(far, TabulatedBound) and far.right_linear and far.kernel.imeta[5] == RIGHT_LINEAR
    L = np.concatenate([FAR_RIGHT, [1e6, np.inf]])
    numpy_up = tables[generator].log(-L, backend="numpy")[1]
    numba_up = tables[generator].log(-L, backend="numba")[1]
    np.testing.assert_allclose(numba_up, numpy_up, rtol=1e-14, atol=0)
    assert numpy_up[-1] == np.inf


@pytest.mark.parametrize("generator", sampled(["cosh(u-1) - 1", "abs(u-1)**1.5"], fast=["abs(u-1)**1.5"]))
def test_user_generator_round_trips(tables, generator, tmp_path):
    path = tmp_path / "t.npz"
    tables[generator].save(path)
    loaded = BandTable.load(path)
    L = _points(tables[generator], seed=1)
    for a, b in zip(loaded.log(-L), tables[generator].log(-L), strict=True):
        assert np.array_equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("generator", ["cosh(u-1) - 1", "abs(u-1)**3"])
def test_user_generator_2d_against_the_oracle(generator, tmp_path):
    """2-D builds over a narrow δ range (one δ-piece per saturating bound), to keep CI short: over [0.01, 0.2] the
    same two generators build too (certified 4.96e-8 and 4.98e-8), in 10-15 min each on 2 shared cores."""
    table = BandTable.build(generator, (0.04, 0.06))
    assert isinstance(table, BandTable2D) and 0 < table.max_rel_error <= 1e-7
    path = tmp_path / "t.npz"
    table.save(path)
    loaded = BandTable2D.load(path)
    for delta in (0.04, 0.0471, 0.06):
        one = loaded.at(delta)
        _check_against_oracle(one, generator, delta, _points(one, int(delta * 1e4), generator, delta))


def test_cli_builds_inspects_and_checks_a_formula(tmp_path, capsys):
    from bandcore.cli import main

    out = tmp_path / "cosh.json"
    assert main(["table", "build", "--divergence", "cosh(u-1) - 1", "--delta", "0.05", "--out", str(out),
                 "--quiet"]) == 0  # fmt: skip
    assert "cosh(u - 1) - 1" in capsys.readouterr().out
    assert main(["table", "inspect", str(out)]) == 0
    assert "upper_right_tail_mode: linear_r" in capsys.readouterr().out
    assert main(["table", "check", str(out), "--points", "5"]) == 0
    assert "within the certified" in capsys.readouterr().out

r"""Trust regions that are monotone transforms of an f-divergence (Rényi, Chernoff, Bhattacharyya).

Each is checked against a direct solve of its own definition, written here independently of the library's
map: for the binary distributions :math:`\pi = (pr, 1 - pr)`, :math:`\pi_{old} = (p, 1 - p)`,

.. math::  \sum_j \pi^\alpha \pi_{old}^{1-\alpha} = p\,r^\alpha + (1-p)\,s^\alpha, \qquad s = \frac{1-pr}{1-p},

and the bound is the root in :math:`y = \log r` of :math:`D(y) = \delta` found by bisection at 50 digits.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys

import mpmath as mp
import numpy as np
import pytest
from tiers import crossed

import bandcore as bc
from bandcore.divergences import get_transform, resolve, resolve_region, resolve_regions

# spelling -> (a, kind): D = log(C_a)/(a - 1) for "renyi", -log(C_a) for "chernoff"
DEFINITIONS = {
    "renyi(2)": (2, "renyi"),
    "renyi(0.5)": (mp.mpf(1) / 2, "renyi"),
    "renyi(3)": (3, "renyi"),
    "renyi(1.5)": (mp.mpf(3) / 2, "renyi"),
    "renyi(0.3)": (mp.mpf(3) / 10, "renyi"),
    "chernoff(0.3)": (mp.mpf(3) / 10, "chernoff"),
    "bhattacharyya": (mp.mpf(1) / 2, "chernoff"),
}
PROBS = (1e-6, 0.01, 0.3, 0.7, 0.97)
DELTAS = (0.01, 0.1, 1.0)
BACKENDS = ("numpy", "numba", "torch")


def _divergence(spelling: str, p: mp.mpf, y: mp.mpf) -> mp.mpf:
    """The transform's own definition on the binary pair, at the current precision (y = log r, r <= 1/p)."""
    a, kind = DEFINITIONS[spelling]
    r = mp.exp(y)
    s = (1 - p * r) / (1 - p)
    coefficient = p * r**a + (1 - p) * (s**a if s > 0 else mp.mpf(0))
    return mp.log(coefficient) / (a - 1) if kind == "renyi" else -mp.log(coefficient)


def _bisect(h, inside: mp.mpf, outside: mp.mpf) -> mp.mpf:
    for _ in range(400):
        mid = (inside + outside) / 2
        inside, outside = (mid, outside) if h(mid) <= 0 else (inside, mid)
    return (inside + outside) / 2


def direct_band_log(spelling: str, p: float, delta: float) -> tuple[float, float]:
    """(log r_lo, log r_up) of {D <= delta} by 50-digit bisection on the definition."""
    with mp.workdps(50):
        p_, delta_ = mp.mpf(p), mp.mpf(delta)

        def h(y):
            return _divergence(spelling, p_, y) - delta_

        top = -mp.log(p_)
        upper = top if h(top) <= 0 else _bisect(h, mp.mpf(0), top)
        # r -> 0 (y = -inf): s = 1/(1-p) and the coefficient is (1-p)^(1-a), so Rényi's D(0) = -log(1-p) and
        # Chernoff's -(1-a) log(1-p): the definition itself at r = 0 decides saturation
        if h(mp.ninf) <= 0:
            return -math.inf, float(upper)
        outside = mp.mpf(-1)
        while h(outside) <= 0:  # h(-inf) > 0 and h is continuous: ends
            outside *= 2
        return float(_bisect(h, mp.mpf(0), outside)), float(upper)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@functools.cache
def _definition_band_log(spelling: str, delta: float) -> np.ndarray:
    """The definition's own 50-digit (log r_lo, log r_up) at :data:`PROBS`, once per process for every backend."""
    return np.array([direct_band_log(spelling, p, delta) for p in PROBS])


#: renyi(1.5) maps to alpha(1.5), which no other fast test compiles for Numba: its Numba case is in the full suite
@pytest.mark.parametrize(("spelling", "backend"), crossed(sorted(DEFINITIONS), BACKENDS,
                                                          fast_numba=[s for s in DEFINITIONS if s != "renyi(1.5)"]))
def test_transform_against_its_definition_on_every_backend(spelling, backend, torch):
    """Every backend within the contract (2e-12: 1e-12 plus the rounding of the mapped radius) of the
    definition's own 50-digit solve, saturated ends exact."""
    log_p = np.log(np.array(PROBS))
    for delta in DELTAS:
        expected = _definition_band_log(spelling, delta)
        x = torch.from_numpy(log_p) if backend == "torch" else log_p
        lo, up = (np.asarray(v, dtype=float) for v in bc.band_log(x, spelling, delta, backend=backend))
        for got, want in ((lo, expected[:, 0]), (up, expected[:, 1])):
            exact = ~np.isfinite(want) | (want == -log_p)
            assert np.array_equal(got[~np.isfinite(want)], want[~np.isfinite(want)]), (backend, delta)
            err = np.abs(got[~exact] - want[~exact]) / np.maximum(1.0, np.abs(want[~exact]))
            assert err.max(initial=0.0) <= 2e-12, (spelling, backend, delta, err)


@pytest.mark.parametrize(
    ("spelling", "base", "mapped"),
    [
        ("renyi(2)", "pearson", lambda d: math.expm1(d)),
        ("renyi(0.5)", "hellinger", lambda d: -2 * math.expm1(-d / 2)),
        ("bhattacharyya", "hellinger", lambda d: -2 * math.expm1(-d)),
        ("renyi(3)", "alpha(3)", lambda d: math.expm1(2 * d) / 6),
        ("chernoff(0.3)", "alpha(0.3)", lambda d: math.expm1(-d) / (0.3 * -0.7)),
    ],
)
def test_the_map_and_its_inverse(spelling, base, mapped):
    for delta in (1e-9, 0.05, 3.0):
        div, delta_f = resolve_region(spelling, delta)
        assert div == resolve(base)
        assert delta_f == pytest.approx(mapped(delta), rel=4e-16)
        assert get_transform(spelling).from_f(delta_f) == pytest.approx(delta, rel=1e-14)


def test_tiny_radius_is_mapped_without_cancellation():
    """expm1: renyi(3) at δ = 1e-12 is alpha(3) at δ/3 (1 + 2δ/2...), not a cancelled difference of exps."""
    _, delta_f = resolve_region("renyi(3)", 1e-12)
    assert delta_f == pytest.approx(1e-12 / 3, rel=1e-11)


def test_radius_beyond_the_kernels_range_is_refused_naming_the_limit():
    transform = get_transform("renyi(10)")
    with pytest.raises(ValueError, match=r"delta=10\.0 for renyi\(10\).*accepts 0 < delta <= 1\.2675"):
        resolve_region("renyi(10)", 10.0)
    assert transform.to_f(transform.delta_max * (1 - 1e-12)) <= 1000
    with pytest.raises(ValueError, match="delta"):
        bc.band_log(np.log([0.5]), "renyi(10)", 10.0)


def test_below_one_the_supremum_is_never_reached_but_rounds_to_the_whole_simplex():
    """renyi(0.5) = hellinger <= 2(1 - e^(-δ/2)) < 2 = sup H: at δ = 20 the Band is the definition's; once
    e^(-δ/2) is below float64 resolution (δ = 100) the radius is sup H and the Band is the whole simplex."""
    transform = get_transform("renyi(0.5)")
    assert transform.f_supremum == 2.0 and transform.delta_max == math.inf
    p = np.array([1e-9, 0.2])
    lo, up = bc.band_log(np.log(p), "renyi(0.5)", 20.0, backend="numpy")
    want = np.array([direct_band_log("renyi(0.5)", q, 20.0) for q in p])
    assert np.array_equal(lo, want[:, 0])
    assert np.allclose(up, want[:, 1], rtol=2e-12, atol=0)
    assert resolve_region("renyi(0.5)", 100.0)[1] == 2.0
    lo, up = bc.band_log(np.log(p), "renyi(0.5)", 100.0, backend="numpy")
    assert np.all(lo == -np.inf) and np.array_equal(up, -np.log(p))


@pytest.mark.parametrize(
    ("spelling", "message"),
    [
        ("renyi(1)", r"order a of renyi\(a\) must satisfy 0 < a <= 64 and a != 1.*got a=1\.0"),
        ("renyi(-2)", r"order a of renyi\(a\) must satisfy 0 < a <= 64 and a != 1.*got a=-2\.0"),
        ("renyi(x)", r"order a of renyi\(a\) must be a number, got a='x'"),
        ("renyi(__import__('os'))", r"must be a number"),
        ("renyi", r"renyi needs an order a"),
        ("chernoff(1.5)", r"order a of chernoff\(a\) must satisfy 0 < a < 1, got a=1\.5"),
        ("chernoff(0)", r"must satisfy 0 < a < 1, got a=0\.0"),
        ("renyi(nan)", r"must be a number, got a='nan'"),
    ],
)
def test_bad_orders_are_refused_naming_the_argument(spelling, message):
    for call in (lambda: resolve_region(spelling, 0.05), lambda: bc.band(np.log([0.5]), spelling, 0.05)):
        with pytest.raises(ValueError, match=message):
            call()


def test_resolve_refuses_a_transform_so_a_radius_is_never_read_in_the_wrong_divergence():
    with pytest.raises(ValueError, match=r"monotone transform of the f-divergence 'pearson'.*resolve_region"):
        resolve("renyi(2)")
    with pytest.raises(ValueError, match="monotone transform"):
        bc.get_divergence("Bhattacharyya")


def test_spellings_and_listing():
    assert get_transform("Rényi( a = 2.0 )").name == "renyi(2)"
    assert get_transform("renyi(alpha=0.25)").base == "alpha(0.25)"
    assert get_transform("kl") is None and get_transform(resolve("kl")) is None
    assert bc.list_divergences(transforms=True)[-3:] == ["renyi", "chernoff", "bhattacharyya"]
    assert "renyi" not in bc.list_divergences()
    assert resolve_regions("renyi(2)", (0.01, 0.2))[1] == (math.expm1(0.01), math.expm1(0.2))
    assert resolve_regions("kl", [0.1, 0.2]) == (resolve("kl"), [0.1, 0.2])


def test_table_of_a_transform_is_its_f_divergence_table_at_the_mapped_radius():
    table = bc.BandTable.build("bhattacharyya", 0.05)
    assert table.divergence == resolve("hellinger") and table.delta == -2 * math.expm1(-0.05)
    assert table.max_rel_error <= 1e-7
    p = np.array([1e-4, 0.05, 0.5])
    lo, up = table.log(np.log(p))
    want = np.array([direct_band_log("bhattacharyya", q, 0.05) for q in p])
    ok = np.isfinite(want)
    assert np.all(np.abs(np.stack([lo, up], 1)[ok] - want[ok]) <= 2e-7 * np.maximum(1, np.abs(want[ok])))


def test_cli_bounds_and_derive_take_a_transform(capsys):
    from bandcore.cli import main

    assert main(["bounds", "--divergence", "renyi(2)", "--delta", "0.05", "--p", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "Band of renyi(2) at delta = 0.05 (pearson at delta = 0.0512711)" in out
    lo, up = bc.band(np.log([0.5]), "pearson", math.expm1(0.05))
    assert f"{lo[0]:>12.6g} {up[0]:>12.6g}" in out
    assert main(["list"]) == 0
    assert "renyi(A)" in capsys.readouterr().out
    assert main(["derive", "renyi(2)", "--delta", "0.05"]) == 0
    assert "--delta 0.05 is pearson <= 0.05127109637602" in capsys.readouterr().out


def test_rl_settings_take_a_transform():
    pytest.importorskip("torch")
    from bandcore.rl.bounds import check_bound_settings

    check_bound_settings(divergence="renyi(2)", delta=0.05)
    with pytest.raises(ValueError, match=r"renyi\(10\) accepts 0 < delta"):
        check_bound_settings(divergence="renyi(10)", delta=10.0)


def test_no_sympy_for_a_catalogue_transform():
    """Mapping a radius is arithmetic: it imports nothing symbolic (a fresh interpreter)."""
    code = (
        "import sys; from bandcore.divergences import resolve_region; resolve_region('renyi(2)', 0.05); "
        "resolve_region('bhattacharyya', 0.05); sys.exit('sympy' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0

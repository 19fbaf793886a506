"""Generators with kinks anywhere (abs, min, max, where), affine regions and exponential growth derive; their
facts agree with independent mpmath computations, closed forms with the oracle; non-convex ones are refused."""

from __future__ import annotations

import time

import mpmath as mp
import pytest
import sympy as sp

from bandcore.derive import derive
from bandcore.derive.generator_facts.branches import active_branch, numeric_at_zero, numeric_slope_at_infinity
from bandcore.derive.generator_facts.symbolic import U
from bandcore.divergences import GeneratorError, resolve
from bandcore.oracle import band_log_mp

pytestmark = pytest.mark.slow

#: formula -> the same generator written by hand in mpmath (independent of the grammar and of SymPy)
GENERATORS = {
    "max(u - 2, 0)": lambda u: max(u - 2, 0),
    "where(abs(u-1) < 1, (u-1)**2/2, abs(u-1) - 1/2)": (
        lambda u: (u - 1) ** 2 / 2 if abs(u - 1) < 1 else abs(u - 1) - mp.mpf(0.5)
    ),
    "abs(u-1)**3": lambda u: abs(u - 1) ** 3,
    "cosh(u-1) - 1": lambda u: mp.cosh(u - 1) - 1,
    "exp(u-1) - u": lambda u: mp.exp(u - 1) - u,
    "log(cosh(u-1))": lambda u: mp.log(mp.cosh(u - 1)),
    "log(1+exp(u-1)) - log(2) - (u-1)/2": lambda u: mp.log(1 + mp.exp(u - 1)) - mp.log(2) - (u - 1) / 2,
    "abs(u-1)**1.5": lambda u: abs(u - 1) ** mp.mpf(1.5),
    "max(u-1, 2*(1-u))": lambda u: max(u - 1, 2 * (1 - u)),
    "where(u <= 2, (u-1)**2, 2*u - 3)": lambda u: (u - 1) ** 2 if u <= 2 else 2 * u - 3,
    "where(u >= 0.5, (u-1)**2, 0.25 - (u - 0.5))": lambda u: (u - 1) ** 2 if u >= 0.5 else 0.25 - (u - 0.5),
    "max((u-1)**2, abs(u-1))": lambda u: max((u - 1) ** 2, abs(u - 1)),
    "max(u-2, 0) + max(0.5-u, 0)": lambda u: max(u - 2, 0) + max(mp.mpf(0.5) - u, 0),
    "where(u > 2, 3*(u-2), 0) + abs(u-1)": lambda u: (3 * (u - 2) if u > 2 else 0) + abs(u - 1),
}
#: generators whose slope lim f(u)/u is infinite (exponential or power growth)
UNBOUNDED = {
    "abs(u-1)**3", "cosh(u-1) - 1", "exp(u-1) - u", "abs(u-1)**1.5", "where(u >= 0.5, (u-1)**2, 0.25 - (u - 0.5))",
    "max((u-1)**2, abs(u-1))",
}  # fmt: skip
DELTAS = (0.05, 0.2)
DPS = 40


def _reference(f):
    """(f'(1-), f'(1+), f̃) of a hand-written generator, by mpmath's one-sided differentiation."""
    with mp.workdps(DPS):
        left = mp.diff(f, mp.mpf(1), direction=-1)
        right = mp.diff(f, mp.mpf(1), direction=1)
    slope = (left + right) / 2
    return left, right, lambda u: f(u) - slope * (u - 1)


def _threshold(g, delta):
    """The p in (0, 1) with g(p) = δ for a monotone g (bisection at DPS digits; 0 or 1 when none)."""
    with mp.workdps(DPS):
        a, b = mp.mpf(10) ** -12, 1 - mp.mpf(10) ** -12
        ga, gb = g(a) - delta, g(b) - delta
        if ga * gb > 0:
            return None
        for _ in range(200):
            m = (a + b) / 2
            gm = g(m) - delta
            if (gm > 0) == (ga > 0):
                a, ga = m, gm
            else:
                b = m
        return (a + b) / 2


@pytest.fixture(scope="module", params=list(GENERATORS))
def derived(request):
    start = time.monotonic()
    d = derive(request.param, progress=False)
    assert time.monotonic() - start < 120  # a hang guard, not a benchmark
    return request.param, d


def test_facts_agree_with_mpmath(derived):
    formula, d = derived
    left, right, f_tilde = _reference(GENERATORS[formula])
    fx = d.facts
    got_left, got_right = (complex(sp.N(s, 30)).real for s in fx.slopes_at_one)
    assert got_left == pytest.approx(float(left), rel=1e-9, abs=1e-12)
    assert got_right == pytest.approx(float(right), rel=1e-9, abs=1e-12)
    with mp.workdps(DPS):
        assert float(sp.N(fx.f_at_zero, 30)) == pytest.approx(float(f_tilde(mp.mpf(10) ** -30)), rel=1e-12, abs=1e-12)
        if formula in UNBOUNDED:
            assert fx.slope_at_infinity == sp.oo
        else:
            x = mp.mpf(10) ** 30
            secant = (f_tilde(2 * x) - f_tilde(x)) / x
            assert float(sp.N(fx.slope_at_infinity, 30)) == pytest.approx(float(secant), rel=1e-12)


@pytest.mark.parametrize("delta", DELTAS)
def test_saturation_thresholds_agree_with_mpmath(derived, delta):
    formula, d = derived
    _, _, f_tilde = _reference(GENERATORS[formula])
    with mp.workdps(DPS):
        at_zero = f_tilde(mp.mpf(10) ** -30)
        upper = _threshold(lambda p: p * f_tilde(1 / p) + (1 - p) * at_zero, delta)
        lower = _threshold(lambda p: p * at_zero + (1 - p) * f_tilde(1 / (1 - p)), delta)
    assert upper is not None and lower is not None  # every generator here saturates at these δ
    assert d.saturation_upper(delta) == pytest.approx(float(upper), abs=1e-9)
    assert d.saturation_lower(delta) == pytest.approx(float(lower), abs=1e-9)


@pytest.mark.parametrize("p", [0.03, 0.3, 0.5, 0.7, 0.97])
def test_closed_forms_agree_with_the_oracle(derived, p):
    formula, d = derived
    for side, expr in (("upper", d.upper), ("lower", d.lower)):
        if expr is None:
            continue
        assert not expr.has(sp.I), f"{formula} {side}: {expr}"
        for delta in (0.01, 0.05, 0.2):
            saturated = d.saturation_upper(delta) <= p if side == "upper" else d.saturation_lower(delta) >= p
            if saturated:
                continue
            y_lo, y_up = band_log_mp(formula, mp.log(p), delta)
            value = complex(sp.N(expr.subs({sp.Symbol("p", positive=True): p,
                                            sp.Symbol("delta", positive=True): delta}), 30))  # fmt: skip
            assert value.imag == 0
            want = float(y_up if side == "upper" else y_lo)
            assert float(mp.log(value.real)) == pytest.approx(want, rel=1e-10, abs=1e-12)


def test_notes_say_what_is_numeric_and_why():
    kinked = derive("max(u - 2, 0)", progress=False)
    text = kinked.to_markdown()
    assert "saturation threshold: numeric" in text and "switch away from u = 1" in text
    assert "does not shrink to r = 1" in text  # E_γ is affine (zero) on [0, 2]
    at_one = derive("max(u-1, 2*(1-u))", progress=False)
    assert any("f'(1) does not exist" in note and "subgradient -1/2" in note for note in at_one.notes)


def test_cube_root_bound_prints_in_real_form():
    d = derive("abs(u-1)**3", progress=False)
    assert d.lower is not None and not d.lower.has(sp.I)
    assert "I" not in sp.sstr(d.lower)


def test_active_branch_resolves_each_piece():
    f = sp.Piecewise(((U - 1) ** 2 / 2, sp.Abs(U - 1) < 1), (sp.Abs(U - 1) - sp.Rational(1, 2), True))
    assert active_branch(f, U, "0+") == (U - 1) ** 2 / 2
    assert active_branch(f, U, "inf") == U - sp.Rational(3, 2)
    assert active_branch(sp.Max(U - 2, 0), U, "1+") == 0
    assert active_branch(sp.Max(U - 2, 0), U, "inf") == U - 2
    assert active_branch(sp.Min((U - 1) ** 2, sp.Abs(U - 1)), U, "1-") == (U - 1) ** 2


def test_numeric_route_limits():
    with mp.workdps(60):
        assert numeric_at_zero(lambda u: u * mp.log(u) - u + 1) == pytest.approx(1, abs=1e-30)
        assert numeric_at_zero(lambda u: -mp.log(u) + u - 1) == mp.inf
        assert numeric_slope_at_infinity(lambda u: u * mp.log(u) - u + 1) == mp.inf
        slope = numeric_slope_at_infinity(lambda u: mp.log(1 + mp.exp(u - 1)) - mp.log(2) - (u - 1) / 2)
        assert slope == pytest.approx(0.5, abs=1e-30)


@pytest.mark.parametrize(
    ("formula", "where"),
    [
        ("where(u < 2, (u-1)**2, 1)", "1.995"),
        ("min(u-1, 0)**2 - max(u-1, 0)**3", "u = 1"),
        ("-abs(u-1)", "u = 1"),
        ("min((u-1)**2, abs(u-1))", "1.995"),
        ("where(u <= 1, (u-1)**2, -(u-1)**2)", "u = 1"),
    ],
)
def test_non_convex_refused_with_the_reason(formula, where):
    start = time.monotonic()
    with pytest.raises(GeneratorError, match="not convex") as err:
        resolve(formula)
    assert where in str(err.value)
    assert time.monotonic() - start < 30  # a hang guard


@pytest.mark.parametrize("formula", ["abs(u-1)**1.5", "where(abs(u-1) < 1, (u-1)**2/2, abs(u-1) - 1/2)"])
def test_table_pieces_are_real_on_both_sides_of_one(formula):
    from bandcore.derive.codegen.table_pieces import table_pieces

    f = GENERATORS[formula]
    _, _, f_tilde = _reference(f)
    _, b, t, t_prime, _ = table_pieces(resolve(formula))
    for x in (-0.9, -0.5, -0.1, 0.1, 0.5, 1.5, 3.0):
        with mp.workdps(DPS):
            want_t = f_tilde(1 + mp.mpf(x))
            want_slope = mp.diff(f_tilde, 1 + mp.mpf(x))
        assert float(t(x)) == pytest.approx(float(want_t), rel=1e-12, abs=1e-15)
        assert float(t_prime(x)) == pytest.approx(float(want_slope), rel=1e-10, abs=1e-12)
        y = float(mp.log(1 + mp.mpf(x)))
        assert float(b(y)) == pytest.approx(float((1 + x) * want_slope), rel=1e-10, abs=1e-12)


@pytest.mark.parametrize(
    "formula",
    [
        "max(u - 2, 0)",  # E_γ: r_up = 2 + δ/p, r_lo = (2p - 1 - δ)/p
        "where(abs(u-1) < 1, (u-1)**2/2, abs(u-1) - 1/2)",  # Huber: two pieces on each side
        "where(u <= 2, (u-1)**2, 2*u - 3)",
        "abs(u-1)**1.5",  # a power of |u - 1|: r = 1 ± (δ/K)^(2/3)
        "abs(u-1)**3",
    ],
)
def test_closed_forms_are_found(formula):
    d = derive(formula, progress=False)
    assert d.upper is not None and d.lower is not None, d.notes


def test_affine_region_bound_is_exact():
    d = derive("max(u - 2, 0)", progress=False)
    p, delta = sp.Symbol("p", positive=True), sp.Symbol("delta", positive=True)
    assert sp.simplify(d.upper - (2 + delta / p)) == 0
    assert sp.simplify(d.lower - (2 * p - 1 - delta) / p) == 0


def test_one_sided_curvature_signs():
    """f''(1-) of |u - 1|^(3/2) is +oo (SymPy's limit as u → 1- of 3/(4 sqrt(1 - u)) says -oo)."""
    fx = derive("abs(u-1)**1.5", progress=False).facts
    assert fx.one_sided[0][:3] == (0, sp.oo, sp.oo)
    assert fx.one_sided[1][:3] == (0, sp.oo, -sp.oo)
    kink = derive("max(u-1, 0)**2 + max(1-u, 0)", progress=False).facts
    assert kink.slopes_at_one == (-1, 0) and kink.f_prime_1 == sp.Rational(-1, 2)
    assert kink.one_sided[1][1] == 2 and kink.one_sided[0][1] == 0

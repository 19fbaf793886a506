"""The switch of a generic plan's r-side functions to their far form, measured per generator
(:mod:`bandcore.derive.codegen.far_threshold`): below it the closed forms are accurate (checked here at points
off the measuring grid), beyond it they are not, and a generator that cannot be measured keeps the fixed switch."""

from __future__ import annotations

import math
import re

import mpmath as mp
import numpy as np
import pytest
import sympy as sp

import bandcore as bc
from bandcore.derive import solver_plan
from bandcore.derive.codegen import far_threshold as ft
from bandcore.derive.codegen.kernel_functions import _closed_source, _far_source, generator_functions
from bandcore.derive.generator_facts.mpmath_g import checked_facts
from bandcore.derive.generator_facts.symbolic import U

NAMES = ["js", "hellinger", "alpha(0.7)", "neyman", "alpha(4.3)", "cosh(u-1) - 1", "(u-1)*log(u)"]


def _errors(name: str, x: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per r-side function: the relative errors of its closed and its far form at u = 1 + x, against mpmath."""
    div = bc.resolve(name)
    functions, f = generator_functions(div), checked_facts(div).f_normalised
    u = 1.0 + x
    x, log_u, t = u - 1.0, np.log(u), 1.0 / u
    out = {}
    for fn, expr in ((functions.phi_r, f / U), (functions.dphi_r, sp.diff(f, U))):
        reference = sp.lambdify(U, expr, "mpmath")
        with mp.workdps(30):
            exact = np.array([float(mp.re(reference(mp.mpf(v)))) for v in u.tolist()])
        closed = ft._values(ft._compiled(_closed_source(fn), "closed"), x, log_u, u)
        far = ft._values(ft._compiled(_far_source(fn), "far"), t, 1.0 - t, log_u, x)
        with np.errstate(all="ignore"):
            out[fn.name] = np.abs(closed - exact) / np.abs(exact), np.abs(far - exact) / np.abs(exact)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_below_the_switch_the_closed_forms_are_as_accurate_as_the_far_ones(name):
    far_x = generator_functions(bc.resolve(name)).far_x
    assert far_x >= ft.FAR_X
    x = np.exp(np.random.default_rng(5).uniform(0.0, np.log(far_x), 300))  # between the grid's points
    for fn_name, (closed, far) in _errors(name, x).items():
        ok = (closed <= 1.5 * ft.FAR_TOLERANCE) | (closed <= 1.5 * ft.FAR_FACTOR * far)
        assert ok.all(), f"{name}.{fn_name}: closed form off by {closed[~ok].max():.2e} at x = {x[~ok][:3]}"


@pytest.mark.parametrize("name, low, high", [
    ("js", 1e30, 1e45),            # L u - (u + 1) log((u + 1)/2) cancels like log u / log 2
    ("alpha(0.7)", 1e35, 1e50),    # c^10/u = e^L/u: the rounding of L (~|L| 1e-16), which the form in t does not feel
    ("neyman", 1e150, 2.0**512),   # x^2 overflows at 2^512
    ("alpha(4.3)", 1e9, 1e12),
    ("hellinger", 1e307, 2.0**1023),
])  # fmt: skip
def test_the_switch_is_measured_per_generator(name, low, high):
    far_x = generator_functions(bc.resolve(name)).far_x
    assert low <= far_x <= high
    if far_x < 1e300:  # beyond the switch (64 octaves: the errors grow slowly, with scatter) both bars are missed
        beyond = far_x * 2.0 ** (np.arange(1, 64 * ft.FAR_STEPS_PER_OCTAVE + 1) / ft.FAR_STEPS_PER_OCTAVE)
        beyond = beyond[np.isfinite(beyond)]
        worst = max(np.nanmax(np.where(np.isfinite(c), c / np.maximum(ft.FAR_TOLERANCE, ft.FAR_FACTOR * f), np.inf))
                    for c, f in _errors(name, beyond).values())  # fmt: skip
        assert worst > 1.0


def test_the_plan_carries_the_switch_to_every_backend():
    plan = solver_plan(bc.resolve("js"))
    far_x = generator_functions(bc.resolve("js")).far_x
    assert plan.far_x == far_x > 1e30
    phi_r = next(fn for fn in plan.functions if fn.name == "phi_r")
    assert f"x > {far_x!r}" in phi_r.select_source  # the compiled backends' select


def test_a_generator_that_cannot_be_measured_keeps_the_fixed_switch(monkeypatch):
    f = bc.resolve("js")
    functions = generator_functions(f)
    sources = tuple((_closed_source(fn), _far_source(fn)) for fn in (functions.phi_r, functions.dphi_r))
    f_tilde = checked_facts(f).f_normalised
    broken = (("def closed(x, L, u):\n    return no_such_name(u)\n", sources[0][1]), sources[1])
    assert ft.far_threshold(f_tilde, broken) == ft.FAR_X
    monkeypatch.setattr(ft, "FAR_SECONDS", 1e-3)  # out of time: the fixed switch, not a refusal
    assert ft.far_threshold(f_tilde, sources) == ft.FAR_X


@pytest.mark.parametrize("name, function", [("js", "log")])
def test_the_compiled_forms_share_their_calls_across_the_switch(name, function):
    """The select form (compiled backends) calls the transcendental that its closed and far forms both call once,
    on an argument selected by the switch, and its values are the closed form's below the switch and the far
    form's above it."""
    from bandcore.kernels.ops import numpy_ops

    functions = generator_functions(bc.resolve(name))
    far_x = functions.far_x
    beyond = np.geomspace(far_x, 1.7e308, 50)[1:]  # above the switch (hellinger's: one octave below overflow)
    x = np.concatenate([np.geomspace(0.2, far_x, 200), beyond, [np.inf]])
    u = 1.0 + x
    t = 1.0 / u
    for fn in (functions.phi_r, functions.dphi_r):
        source = fn.math_source(far_x)
        calls = [len(re.findall(rf"\b{function}\(", form)) for form in (_closed_source(fn), _far_source(fn))]
        assert min(calls) >= 1 and source.count(f"xp.{function}(") == max(calls), source
        scope = {"xp": numpy_ops, "math": math}
        exec(compile(source, "<select form>", "exec"), scope)  # the project's own generated source
        closed = ft._values(ft._compiled(_closed_source(fn), "closed"), x, np.log(u), u)
        far = ft._values(ft._compiled(_far_source(fn), "far"), t, 1.0 - t, np.log(u), x)
        with np.errstate(all="ignore"):
            got = scope[fn.name](x, np.log(u), u)
        want = np.where(x > far_x, far, closed)
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=4e-16, err_msg=f"{name}.{fn.name}")

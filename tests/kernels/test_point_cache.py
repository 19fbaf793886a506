"""A generic plan's functions on NumPy and torch skip a form (Taylor, far) no element of the call needs
(``xp.any_true``), and share what they compute at a point (the forms' masks, the far form's 1/u, their
transcendental calls: ``vectorised._PointCache``, :mod:`bandcore.kernels.shared_calls`) with the plan's other
functions there: they must give the bits of every form and every call computed anew, whatever the points and
their order."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import bandcore as bc
from bandcore.derive import solver_plan
from bandcore.kernels import vectorised
from bandcore.kernels.ops import numpy_ops
from bandcore.kernels.vectorised import generator_functions

NAMES = ["js", "hellinger", "alpha(0.7)", "cosh(u-1) - 1"]


def _every_form(xp: SimpleNamespace) -> SimpleNamespace:
    """``xp`` whose ``any_true`` is always True: every form computed, as on an accelerator."""
    return SimpleNamespace(**{**vars(xp), "any_true": lambda mask: True})


@pytest.fixture
def computed_anew(monkeypatch):
    """``generator_functions`` with every form and every call computed anew (nothing skipped, nothing shared)."""

    def build(plan):
        with monkeypatch.context() as patch:
            patch.setattr(vectorised, "shared", lambda memo, key, compute: compute())
            return generator_functions(plan, _every_form(numpy_ops))

    return build


def _point(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, log u, u) of u = 1 + x, as the solvers' cells give them."""
    return x, np.log1p(x), 1.0 + x


def _points(radius: float, far_x: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "near only": rng.uniform(-0.9, 0.9, 257) * radius,
        "closed only": rng.uniform(1.5 * radius, 0.9 * far_x, 257),
        # far_x is measured per generator (up to ~1e308): the points lie between it and the largest float
        "far only": np.exp(rng.uniform(np.log(far_x) + 1e-12, np.log(np.finfo(float).max), 257)),
        "negative, no form": -rng.uniform(1.5 * radius, 0.99, 257),
        "mixed": np.concatenate([rng.uniform(-0.99, 0.0, 100), rng.exponential(3.0, 100), [0.0, np.inf, np.nan]]),
    }


@pytest.mark.parametrize("name", NAMES)
def test_skipping_and_sharing_keep_the_bits(name, computed_anew):
    plan = solver_plan(bc.resolve(name))
    fast, every = generator_functions(plan, numpy_ops), computed_anew(plan)
    points = _points(plan.taylor_radius, plan.far_x)
    # each function at each kind of point, and the points in turn (a side's masks must never leak to the next)
    for order in (list(points), list(reversed(points))):
        for kind in order:
            point = _point(points[kind])
            for fn in plan.functions:
                with np.errstate(all="ignore"):
                    got, want = fast[fn.name](*point), every[fn.name](*point)
                np.testing.assert_array_equal(got, want, err_msg=f"{name}.{fn.name} at {kind}")


@pytest.mark.parametrize("name", ["js", "alpha(0.7)"])
def test_a_new_point_is_read_afresh(name, computed_anew):
    """A point is the same only by the identity of its arrays: a new one (even of equal values) is computed anew,
    and one of other values never reads the last one's masks or calls."""
    plan = solver_plan(bc.resolve(name))
    fast, every = generator_functions(plan, numpy_ops), computed_anew(plan)
    near, far = _point(np.full(8, 0.05)), _point(np.full(8, 40.0))
    first = fast["phi_r"](*near)
    np.testing.assert_array_equal(fast["dphi_r"](*far), every["dphi_r"](*far))
    np.testing.assert_array_equal(fast["phi_r"](*near), first)
    np.testing.assert_array_equal(first, every["phi_r"](*near))
    for value in (0.5, 40.0):  # the closed form's shared calls, the far form's 1/u: each depends on u
        x, log_u, u = _point(np.full(8, value))
        fast["phi_r"](x, log_u, u)
        np.testing.assert_array_equal(fast["phi_r"](x, log_u, u * 2.0), every["phi_r"](x, log_u, u * 2.0))


def test_solver_needs_nothing_it_skips_or_shares(computed_anew):
    """The solvers' own points: the NumPy solver module equals one built with every form and call computed anew,
    bit for bit, on every pass (seeded, refined, safeguarded)."""
    from bandcore.kernels import solvers
    from bandcore.kernels.backends import lower_at_one, seed, solver_module
    from bandcore.kernels.sources import vectorised_module
    from bandcore.kernels.vectorised import solve_arrays, solver_parts

    x = np.concatenate([-np.random.default_rng(3).exponential(2.0, 4000), -np.geomspace(1e-12, 700.0, 200), [0.0]])
    for name in ["js", "hellinger", "alpha(0.7)"]:
        plan = solver_plan(bc.resolve(name))
        given = {**computed_anew(plan), **solvers.constants(plan)}
        every = vectorised_module(solver_parts("generic"), numpy_ops, f"test_every_form_{plan.key}", given)
        for delta in (0.05, 2.0):
            args = (x, delta, lower_at_one(plan, delta), seed(plan, delta).numpy_arrays())
            with np.errstate(all="ignore"):
                got = solve_arrays(solver_module(plan, "numpy"), plan.kind, *args)
                want = solve_arrays(every, plan.kind, *args)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)


def test_torch_any_true_is_free_on_the_cpu_only():
    torch = pytest.importorskip("torch")
    from bandcore.kernels.ops import torch_ops

    xp = torch_ops()
    assert xp.any_true(torch.zeros(5, dtype=torch.bool)) is False
    assert xp.any_true(torch.tensor([False, True])) is True
    assert xp.any_true(False) is False  # a Python bool (a point of plain numbers)
    traced = torch.compile(lambda m: torch.ones(()) if xp.any_true(m) else torch.zeros(()), backend="eager",
                           fullgraph=True)  # fmt: skip
    assert float(traced(torch.zeros(3, dtype=torch.bool))) == 1.0  # while compiling: computed, never checked


def test_a_side_computes_each_shared_call_once():
    """α = 0.7's φ and φ′ at one point take exp(L/10) and expm1(L/10) once between them, not once each."""
    calls = {"exp": 0, "expm1": 0}

    def counted(name):
        def op(x):
            calls[name] += 1
            return getattr(np, name)(x)

        return op

    xp = SimpleNamespace(**{**vars(numpy_ops), "exp": counted("exp"), "expm1": counted("expm1")})
    functions = generator_functions(solver_plan(bc.resolve("alpha(0.7)")), xp)
    point = _point(np.linspace(0.3, 0.9, 16))  # the closed forms only
    functions["phi_r"](*point)
    functions["dphi_r"](*point)
    assert calls == {"exp": 1, "expm1": 1}


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_a_finished_call_keeps_no_point(backend):
    """The arrays of the last point are let go when a pass is done (on an accelerator they are chunks of millions
    of values)."""
    from bandcore.kernels.backends import solver_module

    plan = solver_plan(bc.resolve("js"))
    x = np.linspace(-12.0, -1e-3, 5000)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        x = torch.from_numpy(x)
    bc.band_log(x, "js", 0.05, backend=backend)
    assert solver_module(plan, backend).POINT_CACHE.last is None

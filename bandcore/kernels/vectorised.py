r"""The solvers on whole arrays: a plan bound to NumPy or torch (:func:`build_module`), and the passes run on them.

A solver module (:func:`build_module`) is the source of :mod:`.lookup` and of the parts of :mod:`.solvers`
executed once per backend (:func:`.sources.vectorised_module`); for a generic plan its generator part is the
plan's: the functions made callable from their sources (:func:`generator_functions`) and the constants.
:func:`solve_arrays` runs the seeded pass on every token, then the refined pass and the safeguarded solver on the
tokens it left.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ..plan import VECTORISED_NAMES, GeneratedFunction, SolverPlan, variadic
from . import lookup, solvers
from .ops import numpy_ops, torch_ops
from .shared_calls import HELPER, share_calls, shared
from .sources import compile_for, vectorised_module

__all__ = ["build_module", "can_select", "compiling", "generator_functions", "release_point", "solve_arrays",
           "solve_lower_at_one", "solve_ratio_arrays", "solver_parts"]  # fmt: skip


def solver_parts(kind: str) -> tuple[ModuleType, ...]:
    """The source modules of a solver module: :mod:`.lookup`, then the parts of :mod:`.solvers` for ``kind``
    (:func:`.solvers.parts`)."""
    return (lookup, *solvers.parts(kind))


def _xp(backend: str) -> Any:
    return numpy_ops if backend == "numpy" else torch_ops()


def build_module(plan: SolverPlan, backend: str) -> ModuleType:
    """The solvers bound to ``backend`` ("numpy" or "torch") and, for a generic plan, to its generator; one module
    per (backend, plan) in ``sys.modules`` (the other kinds share one per backend)."""
    xp = _xp(backend)
    if plan.kind != "generic":
        return vectorised_module(solver_parts(plan.kind), xp, f"bandcore.kernels.solvers_{backend}", {})
    cache = _PointCache(xp, plan.taylor_radius, plan.far_x)
    given = {**generator_functions(plan, xp, cache), **solvers.constants(plan), "POINT_CACHE": cache}
    return vectorised_module(solver_parts("generic"), xp, f"bandcore.kernels.solvers_{backend}_{plan.key}", given)


def release_point(module: ModuleType) -> None:
    """Let go of the last point a generic plan's functions kept (``module.POINT_CACHE``: its arrays, on an
    accelerator chunks of millions of values); the solvers call it when a pass over the tokens is done."""
    cache = getattr(module, "POINT_CACHE", None)
    if cache is not None:
        cache.last = None


def _namespace(xp: Any) -> dict[str, Any]:
    """What the vectorised sources of a plan call (:data:`bandcore.plan.VECTORISED_NAMES`), on ``xp``."""
    names = {"exp": xp.exp, "log": xp.log, "sqrt": xp.sqrt, "Abs": xp.abs, "abs": xp.abs, "pi": math.pi, "E": math.e,
             "log1p": xp.log1p, "expm1": xp.expm1, "xp": xp, "max": variadic(xp.maximum),
             "min": variadic(xp.minimum),
             **{name: getattr(xp, name) for name in ("sinh", "cosh", "tanh", "asinh", "acosh", "atanh")}}  # fmt: skip
    assert set(names) == set(VECTORISED_NAMES)
    return {**names, "builtins": builtins, "range": range, HELPER: shared}


def _compiled(source: str | None, name: str, where: str, namespace: dict[str, Any]) -> Callable | None:
    """The function ``name`` defined by ``source`` (a plan's, checked to be plain arithmetic by
    :func:`bandcore.plan.check_source`), with ``namespace`` as its globals, its transcendental calls shared at a
    point (:func:`.shared_calls.share_calls`: it takes the point's dictionary as its last argument)."""
    if source is None:
        return None
    scope = dict(namespace)
    source, _ = share_calls(source, frozenset(namespace) | {"float"})
    exec(compile_for(namespace["xp"], source, f"<{where}.{name}>"), scope)
    return scope[name]


class _PointCache:
    """What a plan's functions compute at one point (x, L, u), for the last point asked: the masks of the Taylor
    and the far form (``near``: |x| < radius, ``beyond``: x > far_x), whether any element lies in each
    (``xp.any_true``), the far form's t = 1/u and 1 - t where it is computed, and the shared transcendental calls
    (:mod:`.shared_calls`).  The functions of a side are evaluated at the same point one after the other (phi_r
    and dphi_r at r's cells, f_s and k_s at s's), so the second reads them from the first; a point is the same by
    the identity of its arrays, which the solvers never write to.  The last point is let go when a pass over the
    tokens is done (:func:`release_point`); while ``torch.compile`` traces, nothing is kept from one function to
    the next (no tensor of a trace outlives it)."""

    __slots__ = ("far_x", "last", "radius", "xp")

    def __init__(self, xp: Any, radius: float, far_x: float) -> None:
        self.xp, self.radius, self.far_x, self.last = xp, radius, far_x, None

    def at(self, x: Any, log_u: Any, u: Any) -> dict[str, Any]:
        """The dictionary of the point (x, log u, u)."""
        last = self.last  # read once: another thread may replace it
        if last is not None and last[0] is x and last[1] is log_u and last[2] is u:
            return last[3]
        values: dict[str, Any] = {}
        if self.xp is numpy_ops or not compiling():
            self.last = (x, log_u, u, values)
        return values

    def near(self, x: Any, values: dict[str, Any]) -> tuple[Any, bool]:
        """(|x| < radius, whether any element is) at the point of ``values``."""
        if "|near" not in values:
            mask = self.xp.abs(x) < self.radius
            values["|near"] = mask, self.xp.any_true(mask)
        return values["|near"]

    def beyond(self, x: Any, values: dict[str, Any]) -> tuple[Any, bool]:
        """(x > far_x, whether any element is) at the point of ``values``."""
        if "|beyond" not in values:
            mask = x > self.far_x
            values["|beyond"] = mask, self.xp.any_true(mask)
        return values["|beyond"]

    def far_point(self, u: Any, values: dict[str, Any]) -> tuple[Any, Any]:
        """(t = 1/u, 1 - t) at the point of ``values``: the far form's arguments, computed only where it is."""
        if "|far" not in values:
            t = 1.0 / u
            values["|far"] = t, 1.0 - t
        return values["|far"]


def _side_function(fn: GeneratedFunction, plan: SolverPlan, namespace: dict[str, Any], cache: _PointCache
                   ) -> Callable:
    """``fn`` as an element-wise function of (x, L, u): the closed expression, the Taylor polynomial where
    :math:`|x|` < ``plan.taylor_radius``, the far form where :math:`x >` ``plan.far_x``, sharing what they compute
    with the plan's other functions at the same point (:class:`_PointCache`).  A form no element needs is not
    computed where checking that costs no host synchronisation (NumPy, torch on the CPU: ``xp.any_true``); on the
    benchmark's inputs, js at δ = 0.05 has no s-side point within the radius (``docs/kernel_measurements.md``)."""
    where = f"{plan.name}.{fn.name}"
    closed = _compiled(fn.closed, "closed", where, namespace)
    taylor = _compiled(fn.taylor, "taylor", where, namespace)
    far = _compiled(fn.far, "far", where, namespace)
    xp, at_infinity = namespace["xp"], fn.at_infinity

    def evaluate(x, log_u, u):
        values = cache.at(x, log_u, u)
        value = closed(x, log_u, u, values)
        if getattr(value, "shape", None) != getattr(x, "shape", None):  # a constant: broadcast (0 even at x = inf)
            value = value + xp.minimum(xp.abs(x), 0.0)
        if taylor is not None:
            near, any_near = cache.near(x, values)
            if any_near:
                value = xp.where(near, taylor(x, values), value)
        if far is not None:
            beyond, any_beyond = cache.beyond(x, values)
            if any_beyond:
                value = xp.where(beyond, far(*cache.far_point(u, values), log_u, x, values), value)
                value = xp.where(xp.logical_and(u == math.inf, xp.isnan(value)), at_infinity, value)  # 0*log(inf)
        return value

    return evaluate


def generator_functions(plan: SolverPlan, xp: Any, cache: _PointCache | None = None) -> dict[str, Callable]:
    """A generic plan's functions (:data:`bandcore.plan.GENERATOR_FUNCTIONS`) as element-wise callables on ``xp``,
    sharing ``cache`` (a new one if None: :class:`_PointCache`)."""
    cache = cache or _PointCache(xp, plan.taylor_radius, plan.far_x)
    namespace = _namespace(xp)
    return {fn.name: _side_function(fn, plan, namespace, cache) for fn in plan.functions}


def solve_arrays(module: ModuleType, kind: str, lp: Any, delta: float, at_one: float, seed: tuple, *,
                 fallback: bool = True, safeguarded: Callable | None = None) -> tuple:
    """(log r_lo, log r_up, status) of a 1-D NumPy array or torch tensor with ``module`` (a :func:`solver_module`).

    The seeded kinds run their branch-free polished pass (:data:`.solvers.common.POLISHED`) on every token, then on the
    tokens it marked NOT_CONVERGED the :data:`.solvers.common.REFINED` pass (up to ``REFINE_PASSES`` times) and
    the safeguarded solver: only those where selecting them costs no host synchronisation (NumPy, torch on the
    CPU outside ``torch.compile``), else the safeguarded solver on every token, merged by a select.
    ``fallback=False`` stops after the polished pass (the caller then solves the marked tokens itself);
    ``safeguarded(lp) -> (lower, upper, status)`` replaces that solver on every token (the opaque operator of
    :mod:`.opaque`, so ``torch.compile`` does not unroll its loop).
    """
    try:
        return _solve_arrays(module, kind, lp, delta, at_one, seed, fallback, safeguarded)
    finally:
        release_point(module)


def _solve_arrays(module: ModuleType, kind: str, lp: Any, delta: float, at_one: float, seed: tuple, fallback: bool,
                  safeguarded: Callable | None) -> tuple:
    solve = getattr(module, module.ENTRY_POINTS[kind])
    if kind not in module.POLISHED:
        return solve(lp, delta, at_one, seed)
    xp = module.xp
    seeds = getattr(module, module.SEED_READS[kind])(lp, seed)
    lower, upper, status, *offsets = getattr(module, module.POLISHED[kind])(lp, delta, at_one, *seeds)
    if not fallback:
        return lower, upper, status
    redo = status == module.NOT_CONVERGED
    if can_select(lp):
        if bool(redo.any()):
            lower, upper, status = lower + 0.0, upper + 0.0, status + 0.0  # own copies, written below
            offsets = [d[redo] for d in offsets]
            lower[redo], upper[redo], status[redo] = _refined_then_solve(module, kind, lp[redo], delta, at_one, seed,
                                                                         offsets)  # fmt: skip
        return lower, upper, status
    if safeguarded is None:
        lower_again, upper_again, status_again = solve(lp, delta, at_one, seed)
    else:
        lower_again, upper_again, status_again = safeguarded(lp)
    return xp.where(redo, lower_again, lower), xp.where(redo, upper_again, upper), xp.where(redo, status_again, status)


def solve_ratio_arrays(module: ModuleType, kind: str, lp: Any, delta: float, at_one: float, seed: tuple) -> tuple:
    """(r_lo, r_up, status) as :func:`solve_arrays`: the ratios themselves for the kinds that have a ratio form
    (:data:`.solvers.common.RATIO_ENTRY_POINTS`), else exp of the log bounds."""
    if kind in module.RATIO_ENTRY_POINTS:
        return getattr(module, module.RATIO_ENTRY_POINTS[kind])(lp, delta, at_one, seed)
    lower, upper, status = solve_arrays(module, kind, lp, delta, at_one, seed)
    return module.xp.exp(lower), module.xp.exp(upper), status


def _refined_then_solve(module: ModuleType, kind: str, lp: Any, delta: float, at_one: float, seed: tuple,
                        offsets: list) -> tuple:
    """The :data:`.solvers.common.REFINED` pass of ``kind`` (if any) from the polished pass's next ``offsets``,
    again on what each pass left (up to ``REFINE_PASSES`` passes), then the safeguarded solver on the rest; for
    the tokens the polished pass left (selected: NumPy or CPU tensors)."""
    solve = getattr(module, module.ENTRY_POINTS[kind])
    if kind not in module.REFINED:
        return solve(lp, delta, at_one, seed)
    refined = getattr(module, module.REFINED[kind])
    lower, upper, status, d_up, d_lo = refined(lp, delta, at_one, *offsets)
    left = status == module.NOT_CONVERGED
    for _ in range(module.REFINE_PASSES - 1):
        if not bool(left.any()):
            return lower, upper, status
        lower[left], upper[left], status[left], d_up[left], d_lo[left] = refined(lp[left], delta, at_one,
                                                                                 d_up[left], d_lo[left])  # fmt: skip
        left = status == module.NOT_CONVERGED
    if bool(left.any()):
        lower[left], upper[left], status[left] = solve(lp[left], delta, at_one, seed)
    return lower, upper, status


def can_select(array: Any) -> bool:
    """Whether selecting elements of ``array`` by a mask costs no host synchronisation: a NumPy array, or a CPU
    tensor outside ``torch.compile``."""
    return isinstance(array, np.ndarray) or (array.device.type == "cpu" and not compiling())


def compiling() -> bool:
    """Whether ``torch.compile`` is tracing the caller."""
    import torch

    return torch.compiler.is_compiling()


def solve_lower_at_one(plan: SolverPlan, delta: float, module: ModuleType) -> float:
    r"""log r_lo at p = 1 (perspective convention :math:`0\cdot\tilde f(x/0) = x\sigma_\infty`) with ``module``, the
    plan's NumPy solver module (:func:`build_module`).

    The root of :math:`\tilde f(s) + (1-s)\sigma_\infty = \delta`, solved with the generic solver's own
    step in :math:`w = -\log s`; ``-inf`` when it saturates, 0 when :math:`\sigma_\infty = \infty`.
    """
    if plan.kind == "kl":
        return -delta
    if plan.kind == "tv":  # r_lo(1) = 1 - delta
        return math.log1p(-delta) if delta < 1 else -math.inf
    if plan.kind == "pearson":  # sigma_inf = inf: no mass can leave the token
        return 0.0
    sigma, f0, f2, kink = plan.slope_at_infinity, plan.f_at_zero, plan.f2, plan.kink
    if not math.isfinite(sigma):
        return 0.0
    if f0 + sigma <= delta:
        return -math.inf
    w = np.array(math.sqrt(2.0 * delta / f2) if f2 > 0 else delta / max(kink, 1.0))
    lo, hi, w_prev, g_prev = np.array(0.0), np.array(1e308), np.array(math.nan), np.array(math.nan)
    with np.errstate(all="ignore"):
        for _ in range(module.MAX_ITERATIONS):
            x, log_s = np.expm1(-w), -w
            s = np.exp(log_s)
            g = module.f_s(x, log_s, s) - x * sigma
            slope = -module.k_s(x, log_s, s) + s * sigma
            candidate, lo, hi, converged = module.step(g, slope, w, lo, hi, w_prev, g_prev, delta)
            w_prev, g_prev, w = w, g, candidate
            if converged:
                break
    return -float(w)

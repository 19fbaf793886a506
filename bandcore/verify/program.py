r"""Global optimality of the Band, checked with CVXPY over the whole n-category simplex.

For a random old distribution :math:`\pi_{old}` over :math:`n` tokens with :math:`\pi_{old}(a) = p`, the Band's
bounds are the optima of the convex programs

.. math::  r_{up} = \max u_a, \qquad r_{lo} = \min u_a \quad\text{s.t.}\quad
           \sum_j \pi_{old}(j)\, u_j = 1,\ \ \sum_j \pi_{old}(j)\, f(u_j) \le \delta,\ \ u \ge 0,

written in the ratio variable :math:`u = \pi/\pi_{old}` (the plain :math:`\pi` form is badly scaled), with the
generator mapped to DCP atoms by :mod:`.dcp`.  By Jensen's inequality the optimum keeps the
other tokens in their old proportions, :math:`u_j = s = (1 - p\,u_a)/(1 - p)` for :math:`j \ne a`; the report
checks both the optimum value against :func:`bandcore.band` and that proportionality.

Errors are measured in the ratio: :math:`|u_a^{cvx} - r| / \max(1, r)`, i.e. relative for upper bounds
(:math:`r \ge 1`) and absolute for lower bounds (:math:`r \in [0, 1]`, whose roots near 0 carry an absolute
solver floor of about 1e-9).  Proportionality is the :math:`\pi_{old}`-weighted RMS deviation
:math:`\sqrt{\sum_{j\ne a} \pi_{old}(j)(u_j - s)^2/(1-p)}\,/\max(1, s)`; it is not checked for TV (whose
optimum is not unique) nor where the bound is below 1e-6 (there the objective does not depend on the other
tokens to solver precision).

Each program is built once per (n, side) with :class:`cvxpy.Parameter` weights and δ (DPP), and re-solved for
every p and δ.
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import cvxpy as cp
import mpmath as mp
import numpy as np

from .._progress import progress as progress_bar
from ..band import band
from ..derive.generator_facts.mpmath_g import checked_facts, g_boundary, g_ratio
from ..divergences import Divergence, get_transform, resolve, resolve_regions
from .dcp import Builder, dcp_generator
from .report import ACCEPTED_STATUSES, VerificationReport, VerificationRow

__all__ = ["DEFAULT_N", "DEFAULT_P", "SUMMARY_DELTA", "SUMMARY_N", "summary_line", "verify"]

DEFAULT_N = (2, 10, 100, 1000)
DEFAULT_P = (0.001, 0.08, 0.5, 0.9)
SUMMARY_N = (2, 10, 1000)
SUMMARY_DELTA = (0.01, 0.05, 0.2)
#: Bounds below this are not checked for proportionality (the objective is flat in the other tokens).
FLAT_BOUND = 1e-6

# Clarabel at tolerance 1e-10 with strong iterative refinement (1e-12 only costs time at n = 1000).  The
# default step fraction 0.99 is fastest but stalls (InsufficientProgress) on a few exponential-cone programs at
# n = 1000; those, and any result short of "optimal", are solved again with steps of 0.9.  SCS is a
# first-order method that reaches about 1e-8 in reasonable time: a looser, independent cross-check.
_CLARABEL = dict(
    tol_gap_abs=1e-10,
    tol_gap_rel=1e-10,
    tol_feas=1e-10,
    tol_ktratio=1e-10,
    max_iter=200,
    iterative_refinement_max_iter=50,
    iterative_refinement_reltol=1e-15,
    iterative_refinement_abstol=1e-15,
)
_SOLVER_ATTEMPTS: dict[str, tuple[dict[str, float | int], ...]] = {
    "CLARABEL": (_CLARABEL, dict(_CLARABEL, max_step_fraction=0.9)),
    "SCS": (dict(eps_abs=1e-8, eps_rel=1e-8, max_iters=20_000),),
}



class _Program:
    """max or min u_0 subject to Σ w u = 1, Σ w f(u) <= δ, u >= 0, with w and δ as parameters."""

    def __init__(self, build: Builder, n: int, side: str) -> None:
        self.weights = cp.Parameter(n, nonneg=True)
        self.delta = cp.Parameter(nonneg=True)
        self.u = cp.Variable(n, nonneg=True)
        sense = cp.Maximize if side == "upper" else cp.Minimize
        constraints = [
            self.weights @ self.u == 1,
            cp.sum(cp.multiply(self.weights, build(self.u))) <= self.delta,
        ]
        self.problem = cp.Problem(sense(self.u[0]), constraints)

    def solve(self, weights: np.ndarray, delta: float, solver: str) -> tuple[np.ndarray | None, str, float]:
        """Solve (retrying with safer settings unless optimal); returns (u or None, status, seconds)."""
        self.weights.value = weights
        self.delta.value = delta
        start = time.perf_counter()
        status = "solver_error"
        for options in _SOLVER_ATTEMPTS.get(solver, ({},)):
            try:
                with warnings.catch_warnings():
                    # CVXPY warns on optimal_inaccurate; the status is reported in the table instead.
                    warnings.simplefilter("ignore", UserWarning)
                    # warm_start=False: re-using Clarabel's factorisation across parameter values degrades it
                    self.problem.solve(solver=solver, warm_start=False, **options)
                status = self.problem.status
            except cp.error.SolverError:
                status = "solver_error"
            if status == "optimal":
                break
        value = self.u.value if status in ACCEPTED_STATUSES else None
        return value, status, time.perf_counter() - start


def _old_distribution(n: int, p: float, seed: int) -> np.ndarray:
    """π_old of size n with π_old(0) = p and the rest a Dirichlet(1) draw rescaled to 1 - p (seeded per n)."""
    rest = np.random.default_rng([seed, n]).dirichlet(np.ones(n - 1))
    return np.concatenate([[p], (1.0 - p) * rest])


def _compare(
    band_value: float, u: np.ndarray | None, weights: np.ndarray, check_spread: bool
) -> tuple[float, float, float]:
    if u is None:
        return math.nan, math.inf, math.nan
    value = float(u[0])
    error = abs(value - band_value) / max(1.0, band_value)
    if not check_spread or band_value < FLAT_BOUND:
        return value, error, math.nan
    p = weights[0]
    s = (1.0 - p * value) / (1.0 - p)  # the common ratio of the other tokens at the optimum
    rms = math.sqrt(float(np.sum(weights[1:] * (u[1:] - s) ** 2)) / (1.0 - p))
    return value, error, rms / max(1.0, s)


def _check_inputs(
    delta: Any, n: Any, p: Any, tolerance: Any
) -> tuple[tuple[float, ...], tuple[int, ...], tuple[float, ...]]:
    deltas = tuple(np.atleast_1d(np.asarray(delta, dtype=float)).tolist())
    if not deltas or not all(math.isfinite(d) and d > 0 for d in deltas):
        raise ValueError(f"delta must be positive and finite, got {delta!r}")
    sizes = tuple(int(k) for k in n)
    if not sizes or any(k < 2 or k != float(m) for k, m in zip(sizes, n, strict=True)):
        raise ValueError(f"n must be integers >= 2, got {n!r}")
    probs = tuple(float(x) for x in p)
    if not probs or not all(0.0 < x < 1.0 for x in probs):
        raise ValueError(f"p must lie in (0, 1), got {p!r}")
    if not (tolerance > 0):
        raise ValueError(f"tolerance must be positive, got {tolerance!r}")
    return deltas, sizes, probs


def _root_residual(div: Divergence, p: float, delta: float, bound: float, side: str) -> float:
    r""":math:`|g_f(p, r)/\delta - 1|` at the Band's bound (30 digits); a saturated bound needs only
    :math:`g_f \le \delta`, so its residual is :math:`\max(0, g_f/\delta - 1)`."""
    if not math.isfinite(bound):
        return math.nan
    with mp.workdps(30):
        saturated = bound == 0.0 if side == "lower" else bound >= 1.0 / p * (1 - 1e-15)
        if saturated:
            g = g_boundary(div, mp.mpf(p), side)  # exactly on the simplex edge, not through a rounded 1 - p·(1/p)
            return float(max(g / mp.mpf(delta) - 1, 0))
        return float(abs(g_ratio(div, mp.mpf(p), mp.mpf(bound)) / mp.mpf(delta) - 1))


def verify(
    divergence: str | Divergence,
    delta: float | Sequence[float],
    *,
    n: Sequence[int] = DEFAULT_N,
    p: Sequence[float] = DEFAULT_P,
    seed: int = 0,
    solver: str = "CLARABEL",
    cross_check: str | None = "SCS",
    cross_check_max_n: int = 100,
    tolerance: float = 1e-6,
    progress: bool | Callable[[int], None] | None = None,
) -> VerificationReport:
    r"""Solve the n-category trust-region programs with CVXPY and compare their optima with :func:`band`.

    Parameters
    ----------
    divergence : str or Divergence
        Any spelling :func:`~bandcore.divergences.resolve` accepts (name, alias, ``alpha(0.5)``, a formula in
        ``u``) or a :class:`Divergence`; or a transform (``renyi(2)``, ``bhattacharyya``), verified as its
        f-divergence at the mapped radii (:func:`~bandcore.divergences.resolve_region`; the report is stated
        in those).
    delta : float or sequence of float
        Trust-region radius δ > 0 (several δ re-use the same compiled programs).
    n : sequence of int
        Vocabulary sizes; for each, π_old is a seeded Dirichlet(1) draw with π_old(a) = p.
    p : sequence of float
        Old probabilities of the token a, in (0, 1).
    seed : int
        Seed of the π_old draws (the report is deterministic for a given seed and solver build).
    solver : str
        Primary CVXPY solver (Clarabel at tolerance 1e-12 by default).
    cross_check : str or None
        Second solver, run where ``n <= cross_check_max_n``; its errors are reported separately
        (``cross_check_max_error``, ``cross_check_passed`` at 1e-4) and do not decide ``passed``.
    tolerance : float
        Largest accepted error, :math:`|u^{cvx}_a - r|/\max(1, r)`, and proportionality deviation.
    progress : bool, callable or None
        A bar over the programs (one side at one n, p, δ, all its solvers) on stderr: ``None`` draws it when
        stderr is a terminal, ``False`` never, ``True`` always.  A callable draws nothing and is called after
        each program with the number done so far (a caller's own bar).

    Returns
    -------
    VerificationReport

    Raises
    ------
    bandcore.verify.dcp.NotDCPError
        (a ``ValueError``) if the generator cannot be written with CVXPY's DCP atoms.
    bandcore.divergences.GeneratorError
        (a ``ValueError``) if the generator is refused.
    """
    if get_transform(divergence) is not None:  # a transform's radii are mapped here, once
        delta = list(np.atleast_1d(np.asarray(delta, dtype=float)).tolist())
    div, delta = resolve_regions(divergence, delta)
    deltas, sizes, probs = _check_inputs(delta, n, p, tolerance)
    installed = cp.installed_solvers()
    for role, name in (("solver", solver), ("cross_check", cross_check)):
        if name is not None and name not in installed:
            raise ValueError(f"{role} {name!r} is not an installed CVXPY solver; installed: {installed}")
    build = dcp_generator(div)
    check_spread = checked_facts(div).is_smooth_at_one  # TV's optimum is not unique
    bounds = {d: band(np.log(np.asarray(probs)), div, d) for d in deltas}
    residuals = {
        (d, i, side): _root_residual(div, prob, d, float(bounds[d][index][i]), side)
        for d in deltas
        for i, prob in enumerate(probs)
        for index, side in enumerate(("lower", "upper"))
    }

    rows: list[VerificationRow] = []
    build_time = 0.0
    total = 2 * len(sizes) * len(probs) * len(deltas)
    bar = progress_bar(total=total, desc=f"verify {div.name}", unit="program", enabled=_bar_enabled(progress))
    with bar:
        for size, side in itertools.product(sizes, ("upper", "lower")):
            start = time.perf_counter()
            primary = _Program(build, size, side)
            secondary = _Program(build, size, side) if cross_check and size <= cross_check_max_n else None
            build_time += time.perf_counter() - start
            for i, prob in enumerate(probs):
                weights = _old_distribution(size, prob, seed)
                for d in deltas:
                    band_value = float(bounds[d][1 if side == "upper" else 0][i])
                    u, status, elapsed = primary.solve(weights, d, solver)
                    value, error, spread = _compare(band_value, u, weights, check_spread)
                    extra: dict[str, Any] = {}
                    if secondary is not None:
                        u2, status2, _ = secondary.solve(weights, d, cross_check)
                        value2, error2, _ = _compare(band_value, u2, weights, False)
                        extra = dict(cross_value=value2, cross_error=error2, cross_status=status2)
                    extra["residual"] = residuals[(d, i, side)]
                    rows.append(
                        VerificationRow(
                            div.name, size, prob, d, side, band_value, value, error, spread, status, elapsed, **extra
                        )
                    )
                    bar.update(1)
                    if callable(progress):
                        progress(len(rows))
    rows.sort(key=lambda r: (r.delta, r.n, r.p, r.side != "lower"))
    return VerificationReport(div.name, rows, tolerance, solver, cross_check or "", build_time)


def _bar_enabled(progress: bool | Callable[[int], None] | None) -> bool | None:
    """A caller's callback replaces the bar; otherwise ``progress`` decides (see :func:`verify`)."""
    return False if callable(progress) else progress


def summary_line(divergence: str | Divergence, *, progress: bool | None = None) -> str:
    """One deterministic line for the derivation reports: the CVXPY (Clarabel) check at fixed seeds.

    ``progress``: a bar over the programs, as in :func:`verify`.

    The error is stated as an order-of-magnitude bound on an even power of ten (``≤ 1e-08``), so that the
    line regenerates identically on machines whose solver runs differ in the last digits.
    """
    div = resolve(divergence)
    grid = (
        f"n ∈ {{{', '.join(map(str, SUMMARY_N))}}}, p ∈ {{{', '.join(f'{x:g}' for x in DEFAULT_P)}}}, "
        f"δ ∈ {{{', '.join(f'{x:g}' for x in SUMMARY_DELTA)}}}"
    )
    try:
        report = verify(div, SUMMARY_DELTA, n=SUMMARY_N, cross_check=None, progress=progress)
    except ValueError as err:
        return f"Not verified with CVXPY: {err}"
    if not report.passed:
        return f"Verification FAILED: CVXPY (Clarabel) optimum differs from the Band by {report.max_error:.1e} ({grid})"
    exponent = math.ceil(math.log10(max(report.max_error, 1e-16)))
    exponent += exponent % 2  # even powers of ten only
    return (
        f"Verified: CVXPY (Clarabel) optimum over the full simplex agrees with the Band to ≤ 1e{exponent:03d} "
        f"(max over {grid}); the other tokens stay proportional to π_old within "
        f"{report.proportionality_tolerance:.0e}"
    )



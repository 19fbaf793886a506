r"""Global optimality of the Band, checked with CVXPY over the whole n-category simplex.

For a random old distribution :math:`\pi_{old}` over :math:`n` tokens with :math:`\pi_{old}(a) = p`, the Band's
bounds are the optima of the convex programs

.. math::  r_{up} = \max u_a, \qquad r_{lo} = \min u_a \quad\text{s.t.}\quad
           \sum_j \pi_{old}(j)\, u_j = 1,\ \ \sum_j \pi_{old}(j)\, f(u_j) \le \delta,\ \ u \ge 0,

written in the ratio variable :math:`u = \pi/\pi_{old}` (MATH.md §6; the plain :math:`\pi` form is badly scaled)
with the generator mapped to DCP atoms by :mod:`bandcore.dcp`.  By Jensen's inequality the optimum keeps the
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

import argparse
import math
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import cvxpy as cp
import numpy as np

from .band import band
from .dcp import dcp_generator
from .divergences import Divergence, get_divergence, list_divergences

__all__ = ["VerificationReport", "VerificationRow", "register_cli", "summary_line", "verify"]

DEFAULT_N = (2, 10, 100, 1000)
DEFAULT_P = (0.001, 0.08, 0.5, 0.9)
SUMMARY_N = (2, 10, 1000)
SUMMARY_DELTA = (0.01, 0.05, 0.2)
#: Bounds below this are not checked for proportionality (the objective is flat in the other tokens).
FLAT_BOUND = 1e-6
#: Statuses whose values are compared; anything else (infeasible, solver error) is a failure.
ACCEPTED_STATUSES = ("optimal", "optimal_inaccurate")

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


@dataclass(frozen=True)
class VerificationRow:
    """One program: ``side`` (``"lower"``/``"upper"``) of the Band at (``n``, ``p``, ``delta``)."""

    divergence: str
    n: int
    p: float
    delta: float
    side: str
    band: float
    value: float
    error: float
    spread: float
    status: str
    solve_time: float
    cross_value: float = math.nan
    cross_error: float = math.nan
    cross_status: str = ""


@dataclass
class VerificationReport:
    """CVXPY optima against the Band for one divergence.

    Attributes
    ----------
    rows : list of VerificationRow
        One per (n, p, δ, side).
    tolerance : float
        Largest accepted ratio error of the primary solver.
    proportionality_tolerance : float
        Largest accepted deviation of the other tokens from proportionality.  Looser than ``tolerance``: the
        objective depends on them only to second order, so a solver that meets 1e-10 on the optimum pins
        them down to about 1e-5.
    solver, cross_check : str
        The primary solver and the cross-check solver (``""`` for none).
    build_time : float
        Seconds spent building the CVXPY programs (DPP compilation happens in the first solve of each).
    """

    divergence: str
    rows: list[VerificationRow]
    tolerance: float
    solver: str
    cross_check: str
    build_time: float
    proportionality_tolerance: float = 1e-3
    cross_check_tolerance: float = 1e-4
    notes: list[str] = field(default_factory=list)

    @property
    def max_error(self) -> float:
        """Largest ratio error of the primary solver (``inf`` if a solve failed)."""
        return max(row.error for row in self.rows)

    @property
    def max_spread(self) -> float:
        """Largest proportionality deviation where it is checked (0.0 if never checked)."""
        return max((row.spread for row in self.rows if not math.isnan(row.spread)), default=0.0)

    @property
    def cross_check_max_error(self) -> float:
        """Largest ratio error of the cross-check solver where it reports ``optimal`` (``nan`` if nowhere).

        SCS stops at its iteration limit with ``optimal_inaccurate`` on a few hard programs (e.g. p = 0.001);
        those are listed in the table and counted in :meth:`summary`, not folded into this number.
        """
        errors = [row.cross_error for row in self.rows if row.cross_status == "optimal"]
        return max(errors) if errors else math.nan

    @property
    def passed(self) -> bool:
        """Every primary solve accepted, error <= ``tolerance``, deviation <= ``proportionality_tolerance``."""
        return (
            all(row.status in ACCEPTED_STATUSES for row in self.rows)
            and self.max_error <= self.tolerance
            and self.max_spread <= self.proportionality_tolerance
        )

    @property
    def cross_check_passed(self) -> bool:
        """The cross-check solver agrees within ``cross_check_tolerance`` wherever it ran."""
        return not (self.cross_check_max_error > self.cross_check_tolerance)

    @property
    def times(self) -> dict[int, float]:
        """Total solve seconds per n (all p, δ and both sides)."""
        totals: dict[int, float] = {}
        for row in self.rows:
            totals[row.n] = totals.get(row.n, 0.0) + row.solve_time
        return totals

    @property
    def statuses(self) -> dict[str, int]:
        """How often the primary solver returned each status."""
        counts: dict[str, int] = {}
        for row in self.rows:
            counts[row.status] = counts.get(row.status, 0) + 1
        return counts

    def summary(self) -> str:
        """One paragraph: verdict, errors, statuses and times."""
        verdict = "PASSED" if self.passed else "FAILED"
        statuses = ", ".join(f"{k} ×{v}" for k, v in sorted(self.statuses.items()))
        times = ", ".join(f"n={n}: {t:.2f} s" for n, t in sorted(self.times.items()))
        text = (
            f"{self.divergence}: {verdict} (tolerance {self.tolerance:.0e}); {self.solver} max error "
            f"{self.max_error:.1e}, max proportionality deviation {self.max_spread:.1e} (tolerance "
            f"{self.proportionality_tolerance:.0e}); statuses {statuses}; "
            f"solve time {times}; build {self.build_time:.2f} s"
        )
        if self.cross_check:
            solved = [row for row in self.rows if row.cross_status == "optimal"]
            other = [row for row in self.rows if row.cross_status not in ("", "optimal")]
            text += (
                f"; cross-check {self.cross_check} max error {self.cross_check_max_error:.1e} over {len(solved)} "
                f"optimal programs ({'agrees' if self.cross_check_passed else 'DISAGREES'} within "
                f"{self.cross_check_tolerance:.0e})"
            )
            if other:
                worst = max(row.cross_error for row in other)
                text += f", {len(other)} not solved to optimality (excluded; worst error {worst:.1e})"
        return text + "".join(f"\n  note: {note}" for note in self.notes)

    def to_markdown(self) -> str:
        """The rows as a Markdown table, followed by :meth:`summary`."""
        head = ["n", "p", "δ", "side", "Band", self.solver, "error", "proportionality", "status", "ms"]
        if self.cross_check:
            head += [f"{self.cross_check} error", f"{self.cross_check} status"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in self.rows:
            cells = [
                str(row.n),
                f"{row.p:g}",
                f"{row.delta:g}",
                row.side,
                f"{row.band:.12g}",
                f"{row.value:.12g}",
                f"{row.error:.1e}",
                "—" if math.isnan(row.spread) else f"{row.spread:.1e}",
                row.status,
                f"{1e3 * row.solve_time:.0f}",
            ]
            if self.cross_check:
                cells += [f"{row.cross_error:.1e}", row.cross_status] if row.cross_status else ["—", "—"]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n\n" + self.summary()

    def __str__(self) -> str:
        return self.to_markdown()


# --------------------------------------------------------------------------------------------------------
# The programs
# --------------------------------------------------------------------------------------------------------


class _Program:
    """max or min u_0 subject to Σ w u = 1, Σ w f(u) <= δ, u >= 0, with w and δ as parameters."""

    def __init__(self, build, n: int, side: str):
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


def _compare(band_value: float, u: np.ndarray | None, weights: np.ndarray, check_spread: bool):
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


def _check_inputs(delta, n, p, tolerance) -> tuple[tuple[float, ...], tuple[int, ...], tuple[float, ...]]:
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
) -> VerificationReport:
    r"""Solve the n-category trust-region programs with CVXPY and compare their optima with :func:`band`.

    Parameters
    ----------
    divergence : str or Divergence
        A catalogue name/alias or a :class:`Divergence` (e.g. from :meth:`Divergence.from_expression`).
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

    Returns
    -------
    VerificationReport

    Raises
    ------
    bandcore.dcp.NotDCPError
        (a ``ValueError``) if the generator cannot be written with CVXPY's DCP atoms.
    """
    div = get_divergence(divergence)
    deltas, sizes, probs = _check_inputs(delta, n, p, tolerance)
    installed = cp.installed_solvers()
    for role, name in (("solver", solver), ("cross_check", cross_check)):
        if name is not None and name not in installed:
            raise ValueError(f"{role} {name!r} is not an installed CVXPY solver; installed: {installed}")
    build = dcp_generator(div)
    check_spread = div.is_smooth_at_one  # TV's optimum is not unique
    bounds = {d: band(np.log(np.asarray(probs)), div, d) for d in deltas}

    rows = []
    build_time = 0.0
    for size in sizes:
        for side in ("upper", "lower"):
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
                    extra = {}
                    if secondary is not None:
                        u2, status2, _ = secondary.solve(weights, d, cross_check)
                        value2, error2, _ = _compare(band_value, u2, weights, False)
                        extra = dict(cross_value=value2, cross_error=error2, cross_status=status2)
                    rows.append(
                        VerificationRow(
                            div.name, size, prob, d, side, band_value, value, error, spread, status, elapsed, **extra
                        )
                    )
    rows.sort(key=lambda r: (r.delta, r.n, r.p, r.side != "lower"))
    return VerificationReport(div.name, rows, tolerance, solver, cross_check or "", build_time)


def summary_line(divergence: str | Divergence) -> str:
    """One deterministic line for the derivation reports: the CVXPY (Clarabel) check at fixed seeds.

    The error is stated as an order-of-magnitude bound on an even power of ten (``≤ 1e-08``), so that the
    line regenerates identically on machines whose solver runs differ in the last digits.
    """
    div = get_divergence(divergence)
    grid = (
        f"n ∈ {{{', '.join(map(str, SUMMARY_N))}}}, p ∈ {{{', '.join(f'{x:g}' for x in DEFAULT_P)}}}, "
        f"δ ∈ {{{', '.join(f'{x:g}' for x in SUMMARY_DELTA)}}}"
    )
    try:
        report = verify(div, SUMMARY_DELTA, n=SUMMARY_N, cross_check=None)
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


# --------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------

_ALPHA = re.compile(r"^alpha\s*[(=:]\s*([-+0-9.eE]+)\s*\)?$")


def parse_divergence(text: str) -> Divergence:
    """A catalogue name or alias, ``alpha(0.5)``/``alpha=0.5``, or a generator formula in ``u``."""
    match = _ALPHA.match(text.strip())
    if match:
        return get_divergence("alpha", alpha=float(match.group(1)))
    try:
        return get_divergence(text)
    except ValueError:
        return Divergence.from_expression(text)


def _run(args: argparse.Namespace) -> int:
    names = args.names or list_divergences()
    reports = []
    for name in names:
        report = verify(
            parse_divergence(name),
            args.delta,
            n=args.n,
            p=args.p,
            seed=args.seed,
            solver=args.solver,
            cross_check=None if args.cross_check.lower() == "none" else args.cross_check,
            tolerance=args.tolerance,
        )
        reports.append(report)
        print(f"## {report.divergence}\n")
        print(report.to_markdown() if args.table else report.summary())
        print()
    failed = [r.divergence for r in reports if not r.passed]
    verdict = f"; FAILED: {failed}" if failed else ""
    print(f"{len(reports) - len(failed)}/{len(reports)} divergences verified{verdict}")
    return 1 if failed else 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bandcore verify``."""
    parser = subparsers.add_parser(
        "verify",
        help="check the Band against CVXPY's global optimum over the n-category simplex",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="divergences (default: the whole catalogue)")
    parser.add_argument("--delta", type=float, nargs="+", default=[0.05], help="trust-region radius δ")
    parser.add_argument("--n", type=int, nargs="+", default=list(DEFAULT_N), help="vocabulary sizes")
    parser.add_argument("--p", type=float, nargs="+", default=list(DEFAULT_P), help="old token probabilities")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--solver", default="CLARABEL")
    parser.add_argument("--cross-check", default="SCS", help="second solver, or 'none'")
    parser.add_argument("--tolerance", type=float, default=1e-6)
    parser.add_argument("--summary", dest="table", action="store_false", help="one paragraph per divergence")
    parser.set_defaults(handler=_run)

r"""The result of a verification: one :class:`VerificationRow` per convex program, gathered in a
:class:`VerificationReport` with its verdict, summary and Markdown table (no CVXPY here).

Errors are measured in the ratio: :math:`|u_a^{cvx} - r| / \max(1, r)`, i.e. relative for upper bounds
(:math:`r \ge 1`) and absolute for lower bounds (:math:`r \in [0, 1]`, whose roots near 0 carry an absolute
solver floor of about 1e-9).  Proportionality is the :math:`\pi_{old}`-weighted RMS deviation of the other tokens
from the common ratio :math:`s = (1 - p\,u_a)/(1 - p)`.  The root residual
:math:`|g_f(p, r)/\delta - 1|` (30-digit :math:`g_f`) says whether the Band's own value solves the binary
equation, so that a disagreement can be told apart: a Band that is not a root, or a solver that is off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["ACCEPTED_STATUSES", "VerificationReport", "VerificationRow"]

#: Statuses whose values are compared; anything else (infeasible, solver error) is a failure.
ACCEPTED_STATUSES = ("optimal", "optimal_inaccurate")


@dataclass(frozen=True)
class VerificationRow:
    r"""One program: ``side`` (``"lower"``/``"upper"``) of the Band at (``n``, ``p``, ``delta``).

    ``band`` is the Band's bound, ``value`` the solver's optimum of :math:`u_a`, ``error`` their ratio error,
    ``spread`` the proportionality deviation (``nan`` where not checked), ``residual`` the Band's root residual
    :math:`|g_f(p, r)/\delta - 1|` (0 for a saturated bound with :math:`g_f \le \delta`); ``cross_*`` are the
    cross-check solver's.
    """

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
    residual: float = math.nan


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
    def max_residual(self) -> float:
        r"""Largest root residual of the Band's bounds, :math:`|g_f(p, r)/\delta - 1|` (``nan`` if not computed)."""
        values = [row.residual for row in self.rows if not math.isnan(row.residual)]
        return max(values) if values else math.nan

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
            f"{self.proportionality_tolerance:.0e}); Band root residual |g_f/δ - 1| {self.max_residual:.1e}; "
            f"statuses {statuses}; "
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

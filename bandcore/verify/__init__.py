r"""Global optimality of the Band, checked with CVXPY over the whole n-category simplex.

For a random old distribution :math:`\pi_{old}` over :math:`n` tokens with :math:`\pi_{old}(a) = p`, the Band's
bounds are the optima of the convex programs

.. math::  r_{up} = \max u_a, \qquad r_{lo} = \min u_a \quad\text{s.t.}\quad
           \sum_j \pi_{old}(j)\, u_j = 1,\ \ \sum_j \pi_{old}(j)\, f(u_j) \le \delta,\ \ u \ge 0 .

* :mod:`.program` — the programs (CVXPY, DPP), :func:`verify` and :func:`summary_line`;
* :mod:`.dcp` — the generator as CVXPY atoms (from the symbolic plan of :mod:`bandcore.derive.codegen.dcp_plan`);
* :mod:`.report` — :class:`VerificationRow`, :class:`VerificationReport`.
"""

from __future__ import annotations

from .dcp import NotDCPError, dcp_generator
from .program import summary_line, verify
from .report import VerificationReport, VerificationRow

__all__ = ["NotDCPError", "VerificationReport", "VerificationRow", "dcp_generator", "summary_line", "verify"]

r"""The generator the generic solver (:mod:`.generic`) reads: its functions and constants, which a plan supplies.

A generic plan (:class:`bandcore.plan.SolverPlan`) carries the generator's functions as source and its constants;
:mod:`bandcore.kernels.vectorised` (NumPy, torch) and :mod:`bandcore.kernels.compiled` (Numba) build every solver
instance of such a plan with the plan's functions and constants in place of this part.  As imported here they
stand for no generator: the functions raise and the constants are NaN, so that the generic solver cannot run
without a plan.

Each function takes ``(x, L, u)`` with :math:`x = u - 1` and :math:`L = \log u` (both accurate where :math:`u` is
not): :func:`phi_r` :math:`= \Phi(u) = \tilde f(u)/u` and :func:`dphi_r` :math:`= \tilde f'(u)` for :math:`u \ge 1`;
:func:`f_s` :math:`= \tilde f(u)` and :func:`k_s` :math:`= u\tilde f'(u)` for :math:`u \le 1`; :func:`log_f_s`,
:func:`log_k_s` their logarithms (of the absolute value); :func:`log_phi_r`, :func:`log_dphi_r` the logarithms of
the first two for :math:`u > 2`.
"""

from __future__ import annotations

import math

F_AT_ZERO = math.nan  # f̃(0+)  (inf: the lower bound never saturates)
SLOPE_AT_INFINITY = math.nan  # σ∞ = lim f̃(u)/u
F2 = math.nan  # f̃''(1) (0 for a kink)
KINK = math.nan  # f̃'(1+) - f̃'(1-)


def _no_plan(x, L, u):
    raise RuntimeError("the generic solver runs with the functions of a plan (bandcore.kernels.backends.bind)")


phi_r = dphi_r = f_s = k_s = log_f_s = log_k_s = log_phi_r = log_dphi_r = _no_plan

r"""The Band solvers, written once against the element-wise namespace ``xp`` (see :mod:`..ops`).

This package is the single source of the solver arithmetic, in :data:`PARTS`: :mod:`.common` (status codes,
input conventions, seed reads, the registry :data:`.common.ENTRY_POINTS` / :data:`.common.POLISHED`),
:mod:`.generator` (the functions and constants of a generator, which a generic plan supplies), :mod:`.generic`
(the safeguarded Newton for any generator), :mod:`.kl` (KL's Halley solver), :mod:`.seeded`
(the branch-free seeded passes run first) and :mod:`.closed` (TV and Pearson).  :mod:`bandcore.kernels.sources`
concatenates the parts into one module per backend: NumPy arrays, torch tensors (``xp`` bound to
:data:`..ops.numpy_ops` or :func:`..ops.torch_ops`), or Numba scalars (a generated file whose ``xp`` is
:mod:`..numba_fast_ops`); the per-divergence globals of :mod:`.generic` are bound per instance.

**Variables.**  For one token with :math:`\log p` and :math:`\log(1-p)` the upper root is found in the offset
:math:`d = \theta - \theta_p \ge 0` of the new logit :math:`\theta = \operatorname{logit} q` from the old one.
With :math:`E = e^d - 1`:

.. math::
    r - 1 = \frac{(1-p)E}{1 + pE}, \qquad s - 1 = -\frac{pE}{1 + pE}, \qquad
    \log s = -\operatorname{logaddexp}(\log(1-p), \log p + d),

and :math:`G(d) = g_f(p, r)`.  The lower root is the upper root of the mirrored token (swap :math:`\log p` and
:math:`\log(1-p)`): :math:`\log r_{lo} = \log s` there.

Every ``*_bounds(lp, delta, lower_at_one)`` returns ``(log_lower, log_upper, status)`` for any ``lp`` (NaN,
positive, 0, -inf included: :func:`.common.finish` applies the conventions once), ``status`` as in
:class:`bandcore._contract.Status`.
"""

from __future__ import annotations

from types import ModuleType

from . import closed, common, generator, generic, kl, seeded

#: The source modules, in the order they are concatenated (each reads only names defined before it).
PARTS = (common, generator, generic, kl, seeded, closed)


def parts(kind: str) -> tuple[ModuleType, ...]:
    """The parts of a solver module for a plan of ``kind``: :data:`PARTS`, for a generic plan without
    :mod:`.generator` (the plan supplies its functions and constants)."""
    return tuple(part for part in PARTS if kind != "generic" or part is not generator)


def constants(plan) -> dict[str, float]:
    """A generic plan's constants (:class:`bandcore.plan.SolverPlan`) by the names of :mod:`.generator`."""
    return {"F_AT_ZERO": plan.f_at_zero, "SLOPE_AT_INFINITY": plan.slope_at_infinity, "F2": plan.f2, "KINK": plan.kink}

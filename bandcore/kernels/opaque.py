r"""The safeguarded solver as one opaque torch operator, ``bandcore::safeguarded_band``, for ``torch.compile``.

Where selecting tokens would cost a host synchronisation (an accelerator, or while compiling), the tokens the
seeded pass left are solved by running the safeguarded solver on every token for its full iteration count and
merging by a select (:func:`.vectorised.solve_arrays`).  Traced by ``torch.compile``, that loop unrolls: for a
generic plan two bounds × ``MAX_ITERATIONS`` steps, tens of thousands of graph nodes and a minute of tracing
(``docs/kernel_measurements.md``).  Behind this operator the compiler sees one node; the operator runs the same
solver eagerly, with no host synchronisation on an accelerator.

A torch operator takes tensors, numbers and strings only, so the solver it runs is named: a bound torch solver
files itself (:func:`register`) under a name unique to it, for as long as it lives (:data:`_SOLVERS` holds it
weakly; a compiled function keeps its solver alive), and the operator calls that solver's ``safeguarded``.
"""

from __future__ import annotations

from functools import cache
from typing import Any
from weakref import WeakValueDictionary

__all__ = ["register", "safeguarded_band"]

#: name -> a bound torch solver (``solver.safeguarded(lp) -> (lower, upper, status)``), held weakly
_SOLVERS: WeakValueDictionary[str, Any] = WeakValueDictionary()


def register(name: str, solver: Any) -> str:
    """File ``solver`` under ``name`` (unique to it) for as long as it lives; returns the name."""
    _define()  # outside any trace
    _SOLVERS[name] = solver
    return name


@cache
def _define() -> None:
    """Define the operator (once per process)."""
    import torch

    @torch.library.custom_op("bandcore::safeguarded_band", mutates_args=(),
                             schema="(Tensor lp, str solver) -> (Tensor, Tensor, Tensor)")  # fmt: skip
    def safeguarded(lp, solver):
        lower, upper, status = _SOLVERS[solver].safeguarded(lp)
        # fresh tensors: an operator's outputs may not alias its inputs or each other
        return lower.clone(), upper.clone(), status.to(lp.dtype, copy=True)

    @safeguarded.register_fake
    def _(lp, solver):
        return torch.empty_like(lp), torch.empty_like(lp), torch.empty_like(lp)


def safeguarded_band(lp: Any, solver: str) -> tuple[Any, Any, Any]:
    """(lower, upper, status) of every token of the 1-D tensor ``lp`` by the safeguarded solver of the solver
    filed as ``solver`` (:func:`register`), as one operator."""
    import torch

    return torch.ops.bandcore.safeguarded_band(lp, solver)

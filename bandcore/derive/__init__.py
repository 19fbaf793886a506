r"""SymPy derivation of the Band of an f-divergence: closed forms, saturation, limits, small-δ series, reports.

For a token with old probability :math:`p` and ratio :math:`r = \pi/\pi_{old}` the trust region
:math:`D_f(\pi\|\pi_{old}) \le \delta` reduces (Jensen on the other tokens) to the binary condition

.. math::  g_f(p, r) = p\,\tilde f(r) + (1-p)\,\tilde f\!\left(\frac{1 - p r}{1 - p}\right) \le \delta,
           \qquad \tilde f(u) = f(u) - f'(1)(u - 1),

whose two roots around :math:`r = 1` are the Band :math:`[r_{lo}, r_{up}]` (or the simplex edges :math:`0` and
:math:`1/p` when a side saturates).  ``derive(divergence)`` returns a :class:`Derivation`.

This subpackage is the only code in bandcore that imports SymPy.  Its modules fall into three groups, one
subpackage each (the two upper ones import only the first):

* :mod:`.generator_facts` — the facts of a generator: the grammar → SymPy bridge, piecewise branches, time budgets and
  the one 50-digit :math:`g_f`;
* :mod:`.closed_forms` — the closed-form Band (reduction, roots, validation, cells, saturation, limits, series),
  :func:`derive` and its reports;
* :mod:`.codegen` — what other layers run: the solver functions, the tables' pieces and the DCP rewriting.

The names below are bound lazily (PEP 562), so importing one submodule does not load the others.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .closed_forms.derivation import Derivation, catalogue, derive
    from .closed_forms.files import packaged_reports, render_derivations, write_derivations
    from .closed_forms.limits import series_coefficients
    from .closed_forms.reduction import DELTA, P, Q, R
    from .closed_forms.saturation import Saturation
    from .codegen.plans import build_plan, solver_plan
    from .generator_facts.mpmath_g import g_mp
    from .generator_facts.symbolic import Facts, U, facts

__all__ = [
    "DELTA",
    "Derivation",
    "Facts",
    "P",
    "Q",
    "R",
    "Saturation",
    "U",
    "build_plan",
    "catalogue",
    "derive",
    "facts",
    "g_mp",
    "packaged_reports",
    "render_derivations",
    "series_coefficients",
    "solver_plan",
    "write_derivations",
]

_HOME = {
    "Derivation": "derivation",
    "catalogue": "derivation",
    "derive": "derivation",
    "packaged_reports": "files",
    "render_derivations": "files",
    "write_derivations": "files",
    "series_coefficients": "limits",
    "g_mp": "mpmath_g",
    "DELTA": "reduction",
    "P": "reduction",
    "Q": "reduction",
    "R": "reduction",
    "Saturation": "saturation",
    "U": "symbolic",
    "Facts": "symbolic",
    "facts": "symbolic",
    "build_plan": "plans",
    "solver_plan": "plans",
}


def _module(home: str) -> ModuleType:
    if home == "derivation":
        from .closed_forms import derivation as module
    elif home == "files":
        from .closed_forms import files as module
    elif home == "limits":
        from .closed_forms import limits as module
    elif home == "mpmath_g":
        from .generator_facts import mpmath_g as module
    elif home == "reduction":
        from .closed_forms import reduction as module
    elif home == "saturation":
        from .closed_forms import saturation as module
    elif home == "plans":
        from .codegen import plans as module
    else:
        from .generator_facts import symbolic as module
    return module


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

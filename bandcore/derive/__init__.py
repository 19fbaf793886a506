r"""SymPy derivation of the Band of an f-divergence: closed forms, saturation, limits, small-δ series, reports.

For a token with old probability :math:`p` and ratio :math:`r = \pi/\pi_{old}` the trust region
:math:`D_f(\pi\|\pi_{old}) \le \delta` reduces (Jensen on the other tokens) to the binary condition

.. math::  g_f(p, r) = p\,\tilde f(r) + (1-p)\,\tilde f\!\left(\frac{1 - p r}{1 - p}\right) \le \delta,
           \qquad \tilde f(u) = f(u) - f'(1)(u - 1),

whose two roots around :math:`r = 1` are the Band :math:`[r_{lo}, r_{up}]` (or the simplex edges :math:`0` and
:math:`1/p` when a side saturates).  ``derive(divergence)`` returns a :class:`Derivation`.

This subpackage is the only code in bandcore that imports SymPy.  One module per job:

* :mod:`.symbolic` — the grammar → SymPy bridge and the exact facts of a generator (:func:`facts`);
* :mod:`.branches` — the branch of a piecewise generator active near 0⁺, 1∓, ∞, and numeric facts where
  SymPy fails;
* :mod:`.budget` — time budgets for every SymPy call (any thread);
* :mod:`.reduction` — :math:`g_f` symbolically, per side of :math:`u = 1`;
* :mod:`.roots` — closed-form candidate roots by calls that cannot run away;
* :mod:`.mpmath_g` — the one high-precision :math:`g_f` (used by the validation, :mod:`bandcore.oracle` and
  :mod:`bandcore.verify`);
* :mod:`.validate` — candidates checked against bracketed roots;
* :mod:`.cells` — piecewise closed forms for generators that switch branch away from :math:`u = 1`;
* :mod:`.saturation`, :mod:`.limits` — thresholds, limits at :math:`p \to 0, 1`, the small-δ series;
* :mod:`.derivation` — :func:`derive` and :class:`Derivation`;
* :mod:`.report`, :mod:`.files` — Markdown/text reports and the packaged report files;
* :mod:`.dcp_plan` — the generator as a sum of disciplined-convex atoms (for :mod:`bandcore.verify`);
* :mod:`.kernel_functions`, :mod:`.table_pieces` — numeric functions generated for the solvers and tables.

The names below are bound lazily (PEP 562), so importing one submodule does not load the others.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .derivation import Derivation, catalogue, derive
    from .files import packaged_reports, render_derivations, write_derivations
    from .limits import series_coefficients
    from .mpmath_g import g_mp
    from .reduction import DELTA, P, Q, R
    from .saturation import Saturation
    from .symbolic import Facts, U, facts

__all__ = [
    "DELTA",
    "Derivation",
    "Facts",
    "P",
    "Q",
    "R",
    "Saturation",
    "U",
    "catalogue",
    "derive",
    "facts",
    "g_mp",
    "packaged_reports",
    "render_derivations",
    "series_coefficients",
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
}


def _module(home: str) -> ModuleType:
    if home == "derivation":
        from . import derivation as module
    elif home == "files":
        from . import files as module
    elif home == "limits":
        from . import limits as module
    elif home == "mpmath_g":
        from . import mpmath_g as module
    elif home == "reduction":
        from . import reduction as module
    elif home == "saturation":
        from . import saturation as module
    else:
        from . import symbolic as module
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

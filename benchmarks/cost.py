r"""Cost of a generator, for ``bandcore bench``'s "nearest in cost" comparison of user generators.

A Band evaluation's time is dominated by the transcendental functions of the generator :math:`f` (each is tens
of floating-point operations; ``+ - * /`` and integer powers are a few).  :func:`transcendental_count` counts
them in the parsed formula tree of :mod:`bandcore.divergences` (every occurrence: ``log(u)*log(u)`` is 2):
``log exp sqrt cbrt sinh cosh tanh asinh acosh atanh`` and every power whose exponent is not a constant integer
(``u**(1/2)`` is a ``pow``, ``u**3`` a few multiplications).  ``abs``, ``min``, ``max`` and ``where`` are not
counted, their arguments are.

:func:`nearest_in_cost` picks, for a user generator, the catalogue divergence benchmarked in the same run whose
count is closest; among equally close ones the **fastest** (so the ratio user / nearest is the conservative,
larger one).  An exact row is compared with the catalogue divergences run by the same solver
(:func:`solver_of`: a user generator runs the generic safeguarded Newton solver, so not with TV's and Pearson's
closed forms or KL's dedicated Halley solver) whenever the run has one.
"""

from __future__ import annotations

from collections.abc import Mapping

from bandcore.divergences import Node, resolve

__all__ = ["TRANSCENDENTAL_FUNCTIONS", "is_catalogue", "nearest_in_cost", "solver_of", "transcendental_count"]

TRANSCENDENTAL_FUNCTIONS = frozenset({"log", "exp", "sqrt", "cbrt", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh"})


def _count(node: Node) -> int:
    kind = node[0]
    if kind in ("u", "num", "const"):
        return 0
    if kind == "call":
        return (node[1] in TRANSCENDENTAL_FUNCTIONS) + sum(_count(arg) for arg in node[2])
    if kind == "where":
        (_, a, b), then, otherwise = node[1], node[2], node[3]
        return _count(a) + _count(b) + _count(then) + _count(otherwise)
    if kind == "neg":
        return _count(node[1])
    own = kind == "pow" and not (node[2][0] == "num" and node[2][1].denominator == 1)
    return own + _count(node[1]) + _count(node[2])


def transcendental_count(divergence: str) -> int:
    """How many transcendental nodes the generator of ``divergence`` (any spelling :func:`resolve` accepts)
    has (see the module docstring)."""
    return _count(resolve(divergence).tree)


def is_catalogue(divergence: str) -> bool:
    """True for a catalogue or α-family divergence, False for a user generator."""
    return resolve(divergence).is_catalogue


def solver_of(divergence: str) -> str:
    """Which exact solver runs ``divergence``: "kl", "tv", "pearson" (dedicated) or "generic"."""
    from bandcore.derive import solver_plan  # a user generator's plan needs SymPy (once; then it is on disk)

    return solver_plan(resolve(divergence)).kind


def nearest_in_cost(count: int, catalogue: Mapping[str, tuple[int, float]]) -> str | None:
    """The catalogue divergence closest in transcendental count to ``count``, ties to the smallest time.

    ``catalogue``: name -> (transcendental count, time) of the catalogue divergences timed in the same run under
    the same conditions.  None when it is empty.
    """
    if not catalogue:
        return None
    return min(catalogue, key=lambda name: (abs(catalogue[name][0] - count), catalogue[name][1], name))

r"""Divergences: the catalogue, and the one grammar that turns any spelling into a :class:`Divergence`.

An f-divergence is fixed by a convex generator :math:`f` on :math:`(0, \infty)` with :math:`f(1) = 0`:

.. math::  D_f(\pi \,\|\, \pi_{old}) = \sum_j \pi_{old}(j)\, f\!\left(\frac{\pi(j)}{\pi_{old}(j)}\right).

:func:`resolve` accepts every spelling, in every API function, CLI option, table name and trainer config
field: a catalogue name or alias (``"kl"``, ``"bandtv"``), a member of the α-family (``"alpha(0.5)"``), a
formula in ``u`` (``"(sqrt(u)-1)**2"``, see :mod:`.grammar`) or a :class:`Divergence`.  Canonical names
round-trip: ``resolve(d.name) == d`` for catalogue and α divergences, ``resolve(d.formula)`` gives the same
generator for every divergence.

Trust regions that are monotone transforms of an f-divergence (``renyi(a)``, ``chernoff(a)``,
``bhattacharyya``; :mod:`.transforms`) are not f-divergences: they are spelled together with their radius and
:func:`resolve_region` turns ``(spelling, δ)`` into ``(f-divergence, δ_f)`` once, at the API edge (``band``,
``band_log``, tables, ``verify``, the CLI and the trainer configs all call it).  :func:`resolve` refuses them
with a message saying so, so that a radius can never be read in the wrong divergence.

This package imports NumPy only (SymPy lives in :mod:`bandcore.derive`).  A formula is data: it is parsed
against a whitelist, checked numerically (:mod:`.checks`) and never evaluated as code.
"""

from __future__ import annotations

import math
import numbers
import re
import sys
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property, lru_cache
from typing import Any

from .._contract import check_delta
from .catalogue import ALPHA_DEFAULT, ALPHA_DOC, CATALOGUE, alpha_formula
from .grammar import GeneratorError, Node, parse, to_text
from .transforms import TRANSFORMS, Transform, is_transform, parse_transform

__all__ = [
    "Divergence",
    "GeneratorError",
    "Transform",
    "get_divergence",
    "get_transform",
    "list_divergences",
    "resolve",
    "resolve_region",
    "resolve_regions",
]


@dataclass(frozen=True, eq=False)
class Divergence:
    r"""One f-divergence, declared by its generator :math:`f(u)`, :math:`u = \pi/\pi_{old}`.

    Parameters
    ----------
    name : str
        Canonical name (``"kl"``, ``"alpha(3)"``) or, for a user generator, the name given or its formula.
    formula : str
        The generator in the grammar of :mod:`.grammar`, canonical spelling.
    aliases, convention, reference : documentation of catalogue entries.
    params : tuple of (name, value)
        Family parameters (``(("alpha", 3.0),)``).
    """

    name: str
    formula: str
    aliases: tuple[str, ...] = ()
    convention: str = ""
    reference: str = ""
    params: tuple[tuple[str, float], ...] = field(default=())

    @cached_property
    def tree(self) -> Node:
        """The parsed generator (see :mod:`.grammar`)."""
        return parse(self.formula)

    @property
    def is_catalogue(self) -> bool:
        """True for catalogue and α-family members (their name is a spelling of the grammar)."""
        return bool(self.params) or self.name in CATALOGUE

    @property
    def spelling(self) -> str:
        """The shortest spelling :func:`resolve` maps back to this generator: the name or the formula."""
        return self.name if self.is_catalogue else self.formula

    @classmethod
    def from_expression(
        cls, expression: Any, name: str | None = None, *, convention: str = "", reference: str = ""
    ) -> Divergence:
        r"""Build a validated divergence from a formula in ``u``.

        ``expression`` is a ``str`` of the grammar (:mod:`.grammar`) or a SymPy expression in ``u`` (printed,
        then parsed by the same grammar).  Anything else raises :class:`TypeError` before any parsing.  The
        generator is refused with a :class:`GeneratorError` if it is not finite and real on :math:`(0, \infty)`,
        if :math:`f(1) \ne 0`, if it is not convex, or if it is affine (its divergence is identically 0).
        """
        from .checks import check_generator

        text = _formula_text(expression)
        tree = parse(text)
        formula = to_text(tree)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        div = cls(name=name or formula, formula=formula, convention=convention, reference=reference)
        check_generator(tree, div.name)
        return div

    def __repr__(self) -> str:
        return f"Divergence({self.name!r}, f={self.formula})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Divergence) and (self.name, self.formula) == (other.name, other.formula)

    def __hash__(self) -> int:
        return hash((self.name, self.formula))


def _formula_text(expression: Any) -> str:
    if isinstance(expression, str):
        return expression
    sympy = sys.modules.get("sympy")
    if sympy is not None and isinstance(expression, sympy.Expr):
        foreign = {str(s) for s in expression.free_symbols} - {"u"}
        if foreign:
            raise GeneratorError(f"generator may only depend on u, found {sorted(foreign)}")
        return str(expression).replace("Abs(", "abs(")  # SymPy prints within the grammar, or is refused by it
    raise TypeError(
        f"a generator must be a str formula in u (or a SymPy expression), got {type(expression).__name__}"
    )


def list_divergences(*, transforms: bool = False) -> list[str]:
    """Names of the catalogue divergences (aliases not included), e.g. ``["kl", "reverse_kl", ...]``.

    With ``transforms=True`` the names of the monotone transforms of f-divergences follow (``"renyi"``,
    ``"chernoff"``, ``"bhattacharyya"``; see :func:`resolve_region`): they are not f-divergences, so loops that
    derive, verify or tabulate generators leave them out.
    """
    return [*CATALOGUE, "alpha", *(TRANSFORMS if transforms else ())]


def get_transform(spelling: Any) -> Transform | None:
    """The :class:`~bandcore.divergences.transforms.Transform` a spelling names, ``None`` for anything else
    (an f-divergence spelling or a :class:`Divergence`); :class:`ValueError` naming the order for a bad one."""
    return parse_transform(spelling) if is_transform(spelling) else None


def resolve_region(spelling: Any, delta: Any, name: str = "delta") -> tuple[Divergence, float]:
    r"""``(divergence, δ_f)``: the f-divergence and radius of the trust region ``spelling`` ≤ ``delta``.

    For an f-divergence spelling that is ``(resolve(spelling), δ)`` with δ checked (``0 < δ <= 1000``); for a
    transform (``renyi(a)``, ``chernoff(a)``, ``bhattacharyya``) the exact increasing map of
    :mod:`.transforms`, computed with ``expm1``; a δ whose radius lies beyond the kernels' range raises
    :class:`ValueError` naming ``name`` and the largest accepted value.
    """
    known = _RESOLVED.get(spelling) if isinstance(spelling, str) else None  # an f-divergence spelled before
    if known is not None:
        return known, check_delta(delta, name)
    transform = get_transform(spelling)
    if transform is None:
        return resolve(spelling), check_delta(delta, name)
    return resolve(transform.base), transform.to_f(delta, name)


def resolve_regions(spelling: Any, deltas: Any, name: str = "delta") -> tuple[Divergence, Any]:
    """:func:`resolve_region` for several radii: ``deltas`` a number or a tuple/list of them (a 2-D table's
    range, :func:`bandcore.verify.verify`'s radii), returned in the same shape.  For an f-divergence spelling
    the radii are returned as given (the caller checks them as before); a transform's are mapped and checked."""
    transform = get_transform(spelling)
    if transform is None:
        return resolve(spelling), deltas
    if isinstance(deltas, (tuple, list)):
        return resolve(transform.base), type(deltas)(transform.to_f(d, name) for d in deltas)
    return resolve(transform.base), transform.to_f(deltas, name)


@lru_cache(maxsize=1)
def _aliases() -> dict[str, str]:
    return {alias: name for name, entry in CATALOGUE.items() for alias in entry.get("aliases", ())}


#: spelling -> its Divergence, for the spellings :func:`resolve` has resolved without parameters (at most
#: _RESOLVED_MAX of them): a repeated call (``band(x, "js", ...)`` in a training loop) skips the parsing.
_RESOLVED: dict[str, Divergence] = {}
_RESOLVED_MAX = 4096
_ALPHA_SPELLING = re.compile(r"^alpha\s*\(\s*(?:alpha\s*=\s*)?([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*\)$")
_CACHE: dict[tuple, Divergence] = {}


def resolve(spelling: Any, **params: Any) -> Divergence:
    """The :class:`Divergence` named by ``spelling`` (see the module docstring for the accepted spellings).

    Raises :class:`TypeError` for anything but a ``str`` or a :class:`Divergence` (nothing else is parsed) and
    :class:`ValueError` (:class:`GeneratorError` for formulas) listing the valid names for a name that is
    neither in the catalogue nor a formula.
    """
    if isinstance(spelling, Divergence):
        if params:
            raise TypeError(f"parameters {sorted(params)} given with a Divergence object")
        return spelling
    if not isinstance(spelling, str):
        raise TypeError(
            f"divergence must be a name, alpha(a), a formula in u or a Divergence, got {type(spelling).__name__}"
        )
    if not params:
        known = _RESOLVED.get(spelling)
        if known is None:
            known = _resolve_spelling(spelling)
            if len(_RESOLVED) < _RESOLVED_MAX:
                _RESOLVED[spelling] = known
        return known
    return _resolve_spelling(spelling, **params)


def _resolve_spelling(spelling: str, **params: Any) -> Divergence:
    """:func:`resolve` for a string (not cached here)."""
    key = spelling.strip()
    if len(key) > 400:
        raise GeneratorError(f"divergence spelling is {len(key)} characters long; at most 400 are accepted")
    if is_transform(key):
        transform = parse_transform(key)  # a bad order raises here, naming it
        raise ValueError(
            f"divergence {spelling!r} is a monotone transform of the f-divergence {transform.base!r}, not an "
            "f-divergence: give it with its radius (band, band_log, BandTable.build, verify, the CLI and the "
            f"trainer configs map it), or map the radius yourself with resolve_region({transform.name!r}, delta)"
        )
    lowered = key.lower()
    canonical = _aliases().get(lowered, lowered)
    if canonical in CATALOGUE or canonical == "alpha":
        return _catalogue_member(canonical, params)
    match = _ALPHA_SPELLING.match(lowered)
    if match:
        if params:
            raise TypeError(f"parameters {sorted(params)} given with {spelling!r}")
        return _catalogue_member("alpha", {"alpha": float(match.group(1))})
    if params:
        raise TypeError(f"divergence {spelling!r} takes no parameters, got {sorted(params)}")
    if lowered.startswith("alpha"):
        raise ValueError(
            f"divergence {spelling!r}: the alpha family is spelled alpha(a) with a number a, e.g. alpha(0.5)"
        )
    if not any(ch in key for ch in "u()+-*/^") or (key.isidentifier() and key != "u"):
        valid = ", ".join([*list_divergences(), *sorted(_aliases())])
        raise ValueError(f"unknown divergence {spelling!r}; valid names: {valid}, alpha(a), or a formula in u")
    cached = _CACHE.get(("formula", key))
    if cached is None:
        cached = _CACHE.setdefault(("formula", key), Divergence.from_expression(key))
    return cached


#: ``get_divergence(name, **params)``: the catalogue lookup of the public API, the same grammar as :func:`resolve`.
get_divergence = resolve


def _catalogue_member(canonical: str, params: dict[str, Any]) -> Divergence:
    if canonical != "alpha":
        if params:
            raise TypeError(f"divergence {canonical!r} takes no parameters, got {sorted(params)}")
        cache_key: tuple = (canonical,)
        if cache_key not in _CACHE:
            entry = CATALOGUE[canonical]
            _CACHE[cache_key] = Divergence(name=canonical, formula=to_text(parse(entry["formula"])), **{
                k: v for k, v in entry.items() if k != "formula"
            })
        return _CACHE[cache_key]
    unknown = set(params) - {"alpha"}
    if unknown:
        raise TypeError(f"unknown parameter(s) {sorted(unknown)} for 'alpha'; it takes alpha=<float>")
    raw = params.get("alpha", ALPHA_DEFAULT)
    if isinstance(raw, bool) or not isinstance(raw, numbers.Real):
        raise TypeError(f"alpha must be a real number, got {raw!r} ({type(raw).__name__})")
    alpha = float(raw)
    if not math.isfinite(alpha) or abs(alpha) > 64:
        raise ValueError(f"alpha must be a finite number with |alpha| <= 64, got alpha={alpha!r}")
    alpha = alpha + 0.0  # -0.0 -> 0.0
    cache_key = ("alpha", alpha)
    if cache_key not in _CACHE:
        formula = to_text(parse(alpha_formula(Fraction(repr(alpha)))))
        _CACHE[cache_key] = Divergence(
            name=f"alpha({_shortest(alpha)})", formula=formula, params=(("alpha", alpha),), **ALPHA_DOC
        )
    return _CACHE[cache_key]


def _shortest(value: float) -> str:
    """The shortest spelling of ``value`` that reads back to it exactly (``3``, ``0.5``, ``0.3333333333333333``)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)

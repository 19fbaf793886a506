r"""The derivation of one divergence's Band: :func:`derive` and its result, :class:`Derivation`.

For a token with old probability :math:`p` and ratio :math:`r = \pi/\pi_{old}` the trust region
:math:`D_f(\pi\|\pi_{old}) \le \delta` reduces (Jensen on the other tokens) to the binary condition

.. math::  g_f(p, r) = p\,\tilde f(r) + (1-p)\,\tilde f\!\left(\frac{1 - p r}{1 - p}\right) \le \delta,

with :math:`\tilde f(u) = f(u) - f'(1)(u - 1)` (the linear part cancels: :math:`p(r-1) + (1-p)(s-1) = 0`).
:math:`g_f(p,\cdot)` is convex with :math:`g_f(p, 1) = 0`, so the Band is :math:`[r_{lo}, r_{up}] \ni 1`.
:func:`derive` finds, for each side, closed-form candidate roots of :math:`g_f = \delta` (:mod:`.roots`) and
keeps the branch that :mod:`.validate` confirms numerically; then the saturation thresholds
(:mod:`.saturation`), the limits at :math:`p \to 0, 1` and the small-δ series (:mod:`.limits`).

The whole derivation runs under an overall time budget of :data:`DERIVE_SECONDS` (:mod:`.budget`): a generator
that makes SymPy slow gets "no closed form" and numeric thresholds, said plainly in ``notes``; one whose exact
facts cannot be found in time is refused with a :class:`~bandcore.divergences.GeneratorError`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import sympy as sp

from ..._progress import progress as progress_bar
from ...divergences import Divergence, GeneratorError, list_divergences, resolve
from ..generator_facts.budget import available, deadline
from ..generator_facts.mpmath_g import checked_facts, mp_generator
from ..generator_facts.symbolic import Facts
from .cells import piecewise_bound
from .limits import LIMIT_KEYS, asymptotic_root, limits, series
from .powers import power_law_bound
from .reduction import DELTA, R, binary, display_g, on_side
from .roots import real_form, solve_closed, tidy
from .saturation import Saturation, boundary_values, saturation
from .validate import validate_branch

__all__ = ["ALPHA_EXTRA", "DERIVE_SECONDS", "STEPS", "Derivation", "catalogue", "derive"]

#: The α-family members derived beside the default α = 3 in the reports.
ALPHA_EXTRA = (2.0, -1.0, 0.5)
#: Overall time budget of one derivation (seconds); every SymPy call inside gets at most what is left.
DERIVE_SECONDS = 15.0
#: The steps of one derivation, as a progress bar counts them.
STEPS = ("facts", "upper bound", "lower bound", "saturation", "limits", "series")
_CACHE_SIZE = 128


@dataclass(frozen=True)
class Derivation:
    r"""Everything SymPy derives about the Band of one divergence (see the module docstring for the maths).

    Attributes
    ----------
    divergence : Divergence
    g : sympy.Expr
        :math:`g_f(p, r)` in ``P``, ``R`` (a ``Piecewise`` at :math:`r = 1` for kinked generators).
    f_normalised : sympy.Expr
        :math:`\tilde f(u)`.
    f2 : sympy.Expr
        :math:`f''(1)` (0 for a kink at 1).
    upper, lower : sympy.Expr or None
        Closed forms :math:`r_{up}(p, \delta)`, :math:`r_{lo}(p, \delta)`, valid wherever that side is not
        saturated (None: no validated closed form; ``notes`` says why).  Shown in real form (real cube roots)
        when one validates; a formula that still contains ``I`` (said in ``notes``) is evaluated in complex
        arithmetic, and its value is real.
    saturation_upper, saturation_lower : Saturation
    limits : dict
        ``"upper_p0"``, ``"upper_p1"``, ``"lower_p0"``, ``"lower_p1"`` (limits of the ratio bounds as
        :math:`p \to 0, 1` at fixed δ below the saturation level) and ``"q_upper_p0"`` (:math:`\lim p\,r_{up}`).
        A key is absent when the limit has no closed form; :meth:`limit_value` then computes it numerically.
    series : tuple
        :math:`(t, a_2, a_3)`; for a kinked generator ``t = δ/(pJ)`` and the coefficients are 0 when the Band
        is exactly linear (``nan`` when they were not derived).
    notes : tuple of str
        Plain statements of what was found, rejected or not attempted, and why.
    limit_equation : sympy.Expr or None
        :math:`q\sigma_\infty + \tilde f(1 - q) - \delta` (the p → 0 equation in ``Q``), when derived.
    facts : Facts
        The exact facts of the generator (:func:`~bandcore.derive.generator_facts.symbolic.facts`).
    """

    divergence: Divergence
    g: sp.Expr
    f_normalised: sp.Expr
    f2: sp.Expr
    upper: sp.Expr | None
    lower: sp.Expr | None
    saturation_upper: Saturation
    saturation_lower: Saturation
    limits: dict[str, sp.Expr]
    series: tuple[sp.Expr, sp.Expr, sp.Expr]
    notes: tuple[str, ...]
    limit_equation: sp.Expr | None = field(default=None, repr=False)
    facts: Facts | None = field(default=None, repr=False, compare=False)

    def limit_value(self, key: str, delta: float) -> float:
        """The limit ``key`` at ``delta`` as a float: from ``limits`` when closed, else solved numerically."""
        if key not in LIMIT_KEYS:
            raise ValueError(f"key must be one of {LIMIT_KEYS}, got {key!r}")
        if not float(delta) > 0:
            raise ValueError(f"delta must be > 0, got {delta!r}")
        level = self.saturation_upper.level
        q0_saturated = not self.saturation_upper.never and level != sp.oo and float(delta) >= float(level)
        if key in ("q_upper_p0", "lower_p1") and q0_saturated:
            return 1.0 if key == "q_upper_p0" else 0.0  # q_up → 1: all mass moves onto the token
        if key in self.limits:
            return float(sp.N(self.limits[key].subs(DELTA, sp.Float(delta, 30)), 20))
        if self.limit_equation is None:
            raise ValueError(f"the limit {key!r} of {self.divergence.name} was not derived (see the notes)")
        q0 = asymptotic_root(self.limit_equation, delta)
        return float(q0) if key == "q_upper_p0" else float(1 - q0)

    def to_markdown(self, *, verified_line: str | None = None) -> str:
        """A readable report with LaTeX formulas (deterministic: no timings, no dates).

        ``verified_line`` (e.g. ``bandcore.verify.summary_line(divergence)``, computed by the caller) is placed
        between the report's ``verified`` markers; without it the place stays empty.
        """
        from .report import markdown

        return markdown(self, verified_line)

    def to_text(self, delta: float = 0.05) -> str:
        """The same report for a terminal, with numbers evaluated at ``delta``."""
        from .report import text

        return text(self, delta)


def derive(divergence: str | Divergence, *, progress: bool | None = None, **params: float) -> Derivation:
    """Derive the Band of ``divergence`` (any spelling :func:`~bandcore.divergences.resolve` accepts); cached.

    ``params`` are the divergence's parameters (``alpha=0.5``).  ``progress``: a bar over the
    :data:`STEPS` on stderr; ``None`` draws it when stderr is a terminal and the result is not cached yet,
    ``False`` never.

    Raises :class:`~bandcore.divergences.GeneratorError` when the generator is refused (invalid, or too complex
    for SymPy to find its basic facts within the time budget).

    >>> d = derive("pearson", progress=False)
    >>> d.upper
    sqrt(delta)*sqrt(1 - p)/sqrt(p) + 1
    """
    div = resolve(divergence, **params)
    if div in _CACHE:
        return _derive(div)
    with progress_bar(total=len(STEPS), desc=f"derive {div.name}", unit="step", enabled=progress) as bar:

        def step(name: str) -> None:
            bar.set_postfix_str(name, refresh=False)
            bar.update(1)

        return _derive(div, step)


def catalogue() -> list[Divergence]:
    """The divergences of the packaged reports: the catalogue (α = 3) plus α ∈ {2, −1, ½}."""
    named = [resolve(name) for name in list_divergences()]
    return named + [resolve("alpha", alpha=a) for a in ALPHA_EXTRA]


_CACHE: dict[Divergence, Derivation] = {}
_CACHE_LOCK = threading.Lock()


def _derive(div: Divergence, step: Callable[[str], None] | None = None) -> Derivation:
    """The cached derivation of ``div``; ``step(name)`` is called after each of the :data:`STEPS` computed."""
    with _CACHE_LOCK:
        found = _CACHE.get(div)
    if found is not None:
        return found
    try:
        with deadline(DERIVE_SECONDS):
            found = _derive_within_budget(div, step or (lambda name: None))
    except RecursionError:
        raise GeneratorError(f"{div.name}: the generator is nested too deeply for the symbolic engine") from None
    with _CACHE_LOCK:
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))  # the oldest entry
        return _CACHE.setdefault(div, found)


def _piecewise_closed(div: Divergence, side: str, fx: Facts) -> tuple[sp.Expr | None, list[str]]:
    """One side's closed form for f with switches away from u = 1 (:mod:`.cells`), validated like any other."""
    formula, notes = piecewise_bound(div, side, fx.f_normalised)
    if formula is None:
        return None, notes
    branch, branch_notes = validate_branch(div, side, [formula])
    if branch is None:
        return None, [*notes, *branch_notes, f"{side} bound: no closed form — the piecewise formula failed validation"]
    return branch, [*notes, *branch_notes]


def _shorter(div: Divergence, side: str, branch: sp.Expr, rewritten: sp.Expr) -> sp.Expr:
    """``rewritten`` (a tidier or real form of the accepted ``branch``) if it validates too, else ``branch``."""
    if rewritten is branch:
        return branch
    ok, _ = validate_branch(div, side, [rewritten])
    return rewritten if ok is not None else branch


def _fact_notes(fx: Facts) -> list[str]:
    """What the reader must know about the facts: a kink at u = 1 (which slope normalises f) and which facts
    are numeric."""
    notes = []
    left, right = fx.slopes_at_one
    if left != right:
        notes.append(
            f"f has a kink at u = 1: f'(1-) = {sp.sstr(left)}, f'(1+) = {sp.sstr(right)}, so f'(1) does not exist; "
            f"f̃ uses the subgradient {sp.sstr(fx.f_prime_1)} (their mean; any subgradient gives the same g_f)"
        )
    notes.extend(f"numeric fact: {note}" for note in fx.numeric)
    return notes


def _derive_within_budget(div: Divergence, step: Callable[[str], None]) -> Derivation:
    fx = checked_facts(div)
    mp_generator(div)  # refuses a generator whose f̃(0+) or slope at infinity is not a number
    step("facts")
    notes = _fact_notes(fx)
    if not available():
        notes.append("no time budget can be enforced in this thread, so no SymPy solver was run")
    sides = {"upper": ("gt", "lt"), "lower": ("lt", "gt")}  # (side of r, side of s)
    sides_of_one = on_side(fx.f_normalised, "gt"), on_side(fx.f_normalised, "lt")
    pieces: dict[str, sp.Expr | None] = {}
    closed: dict[str, sp.Expr | None] = {}
    for side, (r_side, s_side) in sides.items():
        f_r, f_s = on_side(fx.f_normalised, r_side), on_side(fx.f_normalised, s_side)
        if f_r is None or f_s is None:
            pieces[side] = None
            closed[side], cell_notes = _piecewise_closed(div, side, fx)
            notes.extend(cell_notes)
            step(f"{side} bound")
            continue
        pieces[side] = binary(f_r, f_s)
        candidates, solve_notes = solve_closed(pieces[side] - DELTA, R, f"{side} bound")
        notes.extend(solve_notes)
        branch, branch_notes = validate_branch(div, side, candidates)
        notes.extend(branch_notes)
        power = None if branch is not None else power_law_bound(*sides_of_one, side)
        if power is not None:
            branch, power_notes = validate_branch(div, side, [power])
            notes.append(f"{side} bound: f̃ is a power of |u − 1| on each side, g_f = K|r − 1|^a: r = 1 ± (δ/K)^(1/a)")
            notes.extend(power_notes)
        if branch is not None:
            branch = _shorter(div, side, branch, tidy(branch))
            branch = _shorter(div, side, branch, real_form(branch))
            if branch.has(sp.I):
                notes.append(f"{side} bound: the formula contains I (Cardano); evaluate it in complex arithmetic")
        elif candidates:
            notes.append(f"{side} bound: no closed form — SymPy's roots gave no branch valid on the whole region")
        closed[side] = branch
        step(f"{side} bound")
    g_up, g_lo, level = boundary_values(div, fx)
    saturation_upper, sat_notes = saturation(div, fx, "upper", g_up, level)
    notes.extend(sat_notes)
    saturation_lower, sat_notes = saturation(div, fx, "lower", g_lo, level)
    notes.extend(sat_notes)
    step("saturation")
    found, equation, limit_notes = limits(fx, closed["upper"], closed["lower"], level)
    notes.extend(limit_notes)
    step("limits")
    coefficients, series_notes = series(fx)
    notes.extend(series_notes)
    step("series")
    return Derivation(
        divergence=div,
        g=display_g(fx, pieces),
        f_normalised=fx.f_normalised,
        f2=fx.f2,
        upper=closed["upper"],
        lower=closed["lower"],
        saturation_upper=saturation_upper,
        saturation_lower=saturation_lower,
        limits=found,
        series=coefficients,
        notes=tuple(notes),
        limit_equation=equation,
        facts=fx,
    )

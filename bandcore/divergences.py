r"""The catalogue of f-divergences, and a safe parser for user generators.

An f-divergence is fixed by a convex generator :math:`f` on :math:`(0, \infty)` with :math:`f(1) = 0`:

.. math::  D_f(\pi \,\|\, \pi_{old}) = \sum_j \pi_{old}(j)\, f\!\left(\frac{\pi(j)}{\pi_{old}(j)}\right).

Each catalogue entry declares only its generator (a SymPy expression in the ratio ``u``), its name, aliases,
convention and a reference.  Everything else — :math:`f'(1)`, :math:`f''(1)`, :math:`f(0)`, the normalised
generator :math:`\tilde f(u) = f(u) - f'(1)(u - 1) \ge 0` — is computed from :math:`f`.

User generators come in as strings through :meth:`Divergence.from_expression`, which parses them with
:mod:`ast` against a whitelist and builds the SymPy expression node by node: no Python is ever evaluated.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property

import numpy as np
import sympy as sp

__all__ = ["Divergence", "GeneratorError", "U", "get_divergence", "list_divergences"]

#: The ratio variable u = π/π_old of every generator.
U = sp.Symbol("u", positive=True)


class GeneratorError(ValueError):
    """A generator string or expression that is unsafe, malformed, or not a valid f-divergence generator."""


# --------------------------------------------------------------------------------------------------------
# The safe parser
# --------------------------------------------------------------------------------------------------------

_FUNCTIONS: dict[str, Callable[..., sp.Expr]] = {
    "log": sp.log,
    "ln": sp.log,
    "exp": sp.exp,
    "sqrt": sp.sqrt,
    "cbrt": lambda x: sp.Pow(x, sp.Rational(1, 3)),
    "abs": sp.Abs,
    "Abs": sp.Abs,
}
_CONSTANTS: dict[str, sp.Expr] = {"pi": sp.pi, "E": sp.E, "e": sp.E}
_BINARY = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
}
_MAX_LENGTH = 400
_MAX_NODES = 200
_MAX_LITERAL = 10**6  # keeps exact arithmetic on literals (e.g. 9**9**9) from running away


def parse_generator(text: str) -> sp.Expr:
    """Parse a generator ``f(u)`` from a string without evaluating any Python.

    Allowed: the variable ``u``, numeric literals (``|x| <= 1e6``), ``+ - * / **`` (``^`` is read as ``**``),
    parentheses, the constants ``pi``/``E`` and the functions ``log ln exp sqrt cbrt abs Abs``.
    Anything else (attribute access, other names or calls, keywords, lambdas, subscripts, strings) raises
    :class:`GeneratorError` naming the offending piece.
    """
    if not isinstance(text, str):
        raise GeneratorError(f"expression must be a string, got {type(text).__name__}")
    if len(text) > _MAX_LENGTH:
        raise GeneratorError(f"expression is {len(text)} characters long; at most {_MAX_LENGTH} are accepted")
    try:
        tree = ast.parse(text.replace("^", "**").strip(), mode="eval")
    except SyntaxError as err:
        raise GeneratorError(f"expression {text!r} is not a valid formula: {err.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > _MAX_NODES:
        raise GeneratorError(f"expression {text!r} is too large (more than {_MAX_NODES} syntax nodes)")
    return _build(tree.body, text)


def _build(node: ast.AST, text: str) -> sp.Expr:
    piece = ast.get_source_segment(text.replace("^", "**").strip(), node) or type(node).__name__
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GeneratorError(f"only numbers are allowed as constants, not {piece!r}")
        if not math.isfinite(value) or abs(value) > _MAX_LITERAL:
            raise GeneratorError(f"numeric literal {piece!r} is outside [-1e6, 1e6]")
        return sp.Rational(Fraction(repr(value)))
    if isinstance(node, ast.Name):
        if node.id == "u":
            return U
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise GeneratorError(f"unknown name {node.id!r}: the only variable is 'u' (constants: pi, E)")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _build(node.operand, text)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _build(node.left, text), _build(node.right, text)
        if isinstance(node.op, ast.Pow) and right.is_number:
            if abs(float(right)) > 64:
                raise GeneratorError(f"exponent in {piece!r} is too large (|exponent| <= 64)")
            if left.is_number and left != 0 and abs(float(right) * math.log(abs(float(left)))) > 700:
                raise GeneratorError(f"constant {piece!r} is outside the double-precision range")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            raise GeneratorError(
                f"call {piece!r} is not allowed; allowed functions: {', '.join(sorted(_FUNCTIONS))}"
            )
        if node.keywords or len(node.args) != 1:
            raise GeneratorError(f"function {node.func.id!r} takes exactly one positional argument")
        return _FUNCTIONS[node.func.id](_build(node.args[0], text))
    raise GeneratorError(f"{piece!r} is not allowed in a generator ({type(node).__name__})")


# --------------------------------------------------------------------------------------------------------
# Divergence
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Divergence:
    r"""One f-divergence, declared by its generator :math:`f(u)`, :math:`u = \pi/\pi_{old}`.

    Parameters
    ----------
    name : str
        Canonical name (``"kl"``, ``"hellinger"``, ``"alpha(3)"``, or a user's name).
    f : sympy.Expr
        The generator, an expression in :data:`U`; convex on :math:`(0, \infty)` with :math:`f(1) = 0`.
    aliases : tuple of str
        Other names accepted by :func:`get_divergence`.
    convention : str
        Which direction / scaling this generator means (e.g. ``KL(π_old‖π)``).
    reference : str
        Where the divergence is defined.
    """

    name: str
    f: sp.Expr
    aliases: tuple[str, ...] = ()
    convention: str = ""
    reference: str = ""
    params: tuple[tuple[str, float], ...] = field(default=())

    # ---- construction ----------------------------------------------------------------------------------
    @classmethod
    def from_expression(
        cls, expression: str | sp.Expr, name: str | None = None, *, convention: str = "", reference: str = ""
    ) -> Divergence:
        """Build a validated divergence from a formula in ``u`` (string or SymPy expression).

        Strings go through :func:`parse_generator` (no Python is evaluated).  The generator is refused with a
        :class:`GeneratorError` if :math:`f(1) \\ne 0` or if :math:`f` is not convex on :math:`(0, \\infty)`.
        """
        f = parse_generator(expression) if isinstance(expression, str) else sp.sympify(expression)
        if isinstance(expression, sp.Basic):
            foreign = f.free_symbols - {U}
            if foreign:
                raise GeneratorError(f"generator may only depend on u, found {sorted(map(str, foreign))}")
        div = cls(name=name or str(expression), f=f, convention=convention, reference=reference)
        div.validate()
        return div

    # ---- derived facts (computed from f, never typed) ----------------------------------------------------
    @cached_property
    def f_prime_1(self) -> sp.Expr:
        """f'(1) (one-sided mean for a kink at 1; it cancels in every divergence value)."""
        return _at_one(sp.diff(self.f, U))

    @cached_property
    def f_normalised(self) -> sp.Expr:
        r"""The normalised generator :math:`\tilde f(u) = f(u) - f'(1)(u-1)`, non-negative, minimum 0 at u=1."""
        return sp.expand_log(self.f - self.f_prime_1 * (U - 1), force=True)

    @cached_property
    def derivatives_at_one(self) -> tuple[sp.Expr, sp.Expr, sp.Expr]:
        """(f''(1), f'''(1), f''''(1)): the curvature and the next two Taylor coefficients at u = 1."""
        return tuple(sp.simplify(_at_one(sp.diff(self.f, U, k))) for k in (2, 3, 4))

    @property
    def f2(self) -> sp.Expr:
        """f''(1): the local curvature; small-δ bounds are 1 ± sqrt(2δ(1-p)/(p f''(1)))."""
        return self.derivatives_at_one[0]

    @cached_property
    def f_at_zero(self) -> sp.Expr:
        """The normalised generator at 0, :math:`\\tilde f(0^+) = f(0^+) + f'(1)`; ``oo`` means no saturation."""
        return sp.simplify(sp.limit(self.f_normalised, U, 0, "+"))

    @cached_property
    def slope_at_infinity(self) -> sp.Expr:
        """:math:`\\lim_{u\\to\\infty} \\tilde f(u)/u` (the cost per unit of mass moved onto one token)."""
        return sp.simplify(sp.limit(self.f_normalised / U, U, sp.oo))

    @property
    def is_smooth_at_one(self) -> bool:
        """False for generators with a kink at u = 1 (total variation): the Band is then linear in δ."""
        return not self.f2.has(sp.DiracDelta) and bool(self.f2.is_finite) and bool(self.f2 > 0)

    # ---- numerics ----------------------------------------------------------------------------------------
    @cached_property
    def numpy_f(self) -> Callable[[np.ndarray], np.ndarray]:
        """Vectorised :math:`\\tilde f` (NumPy)."""
        return sp.lambdify(U, self.f_normalised, "numpy")

    def validate(self) -> None:
        """Raise :class:`GeneratorError` unless f is real on (0, ∞), f(1) = 0 and f is convex on (0, ∞)."""
        if self.f.free_symbols - {U}:
            raise GeneratorError(f"{self.name}: generator may only depend on u")
        at_one = sp.simplify(self.f.subs(U, 1))
        if at_one != 0:
            raise GeneratorError(f"{self.name}: f(1) must be 0, got f(1) = {at_one}; subtract it from f")
        if not self._convex_symbolically():
            self._check_convex_numerically()

    def _convex_symbolically(self) -> bool:
        f2 = sp.simplify(sp.diff(self.f, U, 2))
        if f2.has(sp.DiracDelta, sp.Heaviside, sp.sign, sp.Abs, sp.Piecewise):
            return False
        return bool(f2.is_nonnegative)

    def _check_convex_numerically(self) -> None:
        # Convexity ⇔ secant slopes non-decreasing; robust to kinks (Abs) where f'' is a delta.
        grid = np.concatenate([np.logspace(-6, 0, 1500, endpoint=False), np.logspace(0, 6, 1500)])
        with np.errstate(all="ignore"):
            values = np.asarray(sp.lambdify(U, self.f, "numpy")(grid), dtype=float) * np.ones_like(grid)
        if not np.all(np.isfinite(values)):
            bad = grid[~np.isfinite(values)][0]
            raise GeneratorError(f"{self.name}: f is not finite and real on (0, inf), e.g. f({bad:.3g})")
        steps = np.diff(grid)
        slopes = np.diff(values) / steps
        drops = np.diff(slopes)
        # rounding in each secant slope is about eps·(|f_i| + |f_i+1|)/Δu
        rounding = np.abs(values[:-1]) + np.abs(values[1:])
        slope_noise = 8 * np.finfo(float).eps * rounding / steps
        tol = 1e-9 * (np.abs(slopes[:-1]) + np.abs(slopes[1:]) + 1.0) + slope_noise[:-1] + slope_noise[1:]
        if np.any(drops < -tol):
            i = int(np.argmax(-(drops + tol)))
            raise GeneratorError(
                f"{self.name}: f is not convex on (0, inf): its slope decreases near u = {grid[i + 1]:.4g}"
            )

    def __repr__(self) -> str:
        return f"Divergence({self.name!r}, f={self.f})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Divergence) and self.name == other.name and self.f == other.f

    def __hash__(self) -> int:
        return hash((self.name, self.f))


def _at_one(expr: sp.Expr) -> sp.Expr:
    value = expr.subs(U, 1)
    if value.has(sp.nan, sp.zoo) or value.has(sp.sign, sp.Abs, sp.DiracDelta):
        value = (sp.limit(expr, U, 1, "+") + sp.limit(expr, U, 1, "-")) / 2
    return sp.simplify(value)


# --------------------------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------------------------

_u = U
_CATALOGUE: dict[str, dict] = {
    "kl": dict(
        f=-sp.log(_u),
        aliases=("bandkl",),
        convention="KL(π_old‖π) = Σ π_old log(π_old/π); the direction BandPO trains with",
        reference="Kullback & Leibler (1951); BandPO (2025)",
    ),
    "reverse_kl": dict(
        f=_u * sp.log(_u),
        convention="KL(π‖π_old) = Σ π log(π/π_old)",
        reference="Kullback & Leibler (1951)",
    ),
    "tv": dict(
        f=sp.Abs(_u - 1) / 2,
        aliases=("bandtv",),
        convention="total variation ½ Σ |π − π_old|, in [0, 1]",
        reference="Csiszár (1967)",
    ),
    "pearson": dict(
        f=(_u - 1) ** 2,
        aliases=("bandchi2",),
        convention="Pearson χ² = Σ (π − π_old)²/π_old",
        reference="Pearson (1900)",
    ),
    "neyman": dict(
        f=(_u - 1) ** 2 / _u,
        convention="Neyman χ² = Σ (π − π_old)²/π",
        reference="Neyman (1949)",
    ),
    "hellinger": dict(
        f=(sp.sqrt(_u) - 1) ** 2,
        convention="squared Hellinger Σ (√π − √π_old)², in [0, 2] (not halved)",
        reference="Hellinger (1909)",
    ),
    "lecam": dict(
        f=(_u - 1) ** 2 / (_u + 1),
        convention="Le Cam / triangular discrimination Σ (π − π_old)²/(π + π_old), in [0, 2]",
        reference="Le Cam (1986)",
    ),
    "js": dict(
        f=(_u * sp.log(_u) - (1 + _u) * sp.log((1 + _u) / 2)) / 2,
        convention="Jensen–Shannon ½KL(π‖m) + ½KL(π_old‖m), m = (π + π_old)/2, in [0, log 2] (nats)",
        reference="Lin (1991)",
    ),
}
_ALPHA_DEFAULT = 3.0
_ALPHA_DOC = dict(
    convention="α-divergence (u^α − 1 − α(u − 1))/(α(α − 1)); α→1 reverse KL, α→0 KL, α=2 Pearson/2",
    reference="Amari (1985); Cichocki & Amari (2010)",
)


def _alpha_generator(alpha: float) -> sp.Expr:
    a = sp.Rational(Fraction(repr(float(alpha))))
    if a == 0:
        return -sp.log(_u) + _u - 1
    if a == 1:
        return _u * sp.log(_u) - _u + 1
    return (_u**a - 1 - a * (_u - 1)) / (a * (a - 1))


def list_divergences() -> list[str]:
    """Names of the catalogue divergences (aliases not included), e.g. ``["kl", "reverse_kl", ...]``."""
    return [*_CATALOGUE, "alpha"]


def _aliases() -> dict[str, str]:
    return {alias: name for name, entry in _CATALOGUE.items() for alias in entry.get("aliases", ())}


def get_divergence(name: str | Divergence, **params: float) -> Divergence:
    """Look a divergence up by name or alias; a :class:`Divergence` passes through unchanged.

    ``get_divergence("alpha", alpha=3.0)`` builds a member of the α-family (default α = 3).
    Unknown names raise :class:`ValueError` listing the valid ones.
    """
    if isinstance(name, Divergence):
        if params:
            raise TypeError(f"parameters {sorted(params)} given with a Divergence object")
        return name
    if not isinstance(name, str):
        raise TypeError(f"divergence must be a name or a Divergence, got {type(name).__name__}")
    key = name.strip().lower()
    return _lookup(_aliases().get(key, key), tuple(sorted(params.items())))


_CACHE: dict[tuple, Divergence] = {}


def _lookup(key: str, params: tuple[tuple[str, float], ...]) -> Divergence:
    cached = _CACHE.get((key, params))
    if cached is not None:
        return cached
    given = dict(params)
    if key == "alpha":
        unknown = set(given) - {"alpha"}
        if unknown:
            raise TypeError(f"unknown parameter(s) {sorted(unknown)} for 'alpha'; it takes alpha=<float>")
        alpha = float(given.get("alpha", _ALPHA_DEFAULT))
        if not math.isfinite(alpha) or abs(alpha) > 64:
            raise ValueError(f"alpha must be a finite number with |alpha| <= 64, got {alpha!r}")
        div = Divergence(
            name=f"alpha({alpha:g})", f=_alpha_generator(alpha), params=(("alpha", alpha),), **_ALPHA_DOC
        )
    else:
        canonical = _aliases().get(key, key)
        if canonical not in _CATALOGUE:
            valid = ", ".join([*list_divergences(), *sorted(_aliases())])
            raise ValueError(f"unknown divergence {key!r}; valid names: {valid}")
        if params:
            raise TypeError(f"divergence {canonical!r} takes no parameters, got {sorted(given)}")
        div = Divergence(name=canonical, **_CATALOGUE[canonical])
    _CACHE[(key, params)] = div
    return div

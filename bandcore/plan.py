r"""The plan of a divergence's solver: everything :mod:`bandcore.kernels` needs, made once by :mod:`bandcore.derive`.

A :class:`SolverPlan` is frozen, holds strings, floats and tuples only (no SymPy), and round-trips through JSON
(:meth:`SolverPlan.to_json`, :meth:`SolverPlan.from_json`), so that :func:`bandcore.derive.solver_plan` can keep it
on disk and a new process binds a user generator without loading SymPy.  It says:

* ``kind``: which solver of :mod:`bandcore.kernels.solvers` runs it (one of :data:`SOLVER_KINDS`: KL's Halley
  solver, the closed forms of TV and Pearson, or the generic safeguarded Newton);
* for the generic solver, the generator's functions (:data:`GENERATOR_FUNCTIONS`, :class:`GeneratedFunction`) as
  Python source and its constants :math:`\tilde f(0^+)`, :math:`\sigma_\infty`, :math:`\tilde f''(1)` and the
  kink at 1;
* ``seed_key``: what the solver's seed tables on disk are keyed by (:mod:`bandcore.kernels.seeds`);
* ``key``: a digest of all of it, the plan's identity in every cache.

The sources are data read back from a cache file, so :func:`check_source` admits nothing but arithmetic: one
function definition of the expected name and arguments whose body assigns, returns and calls the element-wise
functions of :data:`VECTORISED_NAMES` or ``xp.``/``math.`` attributes.  A plan that fails any check is refused
with :class:`PlanError`, and the caller derives it again.
"""

from __future__ import annotations

import ast
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["GENERATOR_FUNCTIONS", "PLAN_FORMAT", "SOLVER_KINDS", "VECTORISED_NAMES", "GeneratedFunction", "PlanError",
           "SolverPlan", "check_source", "variadic"]  # fmt: skip

#: Version of the plan's layout; a plan file of another version is derived again.
PLAN_FORMAT = 1
#: The solvers of :mod:`bandcore.kernels.solvers`: KL's, the closed forms of TV and Pearson, the generic one.
SOLVER_KINDS = ("kl", "tv", "pearson", "generic")
#: The functions of a generator the generic solver calls, each of ``(x, L, u)`` with x = u - 1, L = log u:
#: Φ(u) = f̃(u)/u and f̃′(u) for u >= 1; f̃(u) and u f̃′(u) for u <= 1; the logarithms of the last two; the logarithms
#: of the first two for u > 2.
GENERATOR_FUNCTIONS = ("phi_r", "dphi_r", "f_s", "k_s", "log_f_s", "log_k_s", "log_phi_r", "log_dphi_r")
#: The names the vectorised sources may call (bound by :mod:`bandcore.kernels` to its element-wise namespace)
VECTORISED_NAMES = ("exp", "log", "sqrt", "Abs", "abs", "pi", "E", "log1p", "expm1", "xp", "max", "min", "sinh", "cosh",
                    "tanh", "asinh", "acosh", "atanh")  # fmt: skip


def variadic(pairwise: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    """The printed ``max(a, b, c)``/``min`` of a source (SymPy's Max, Min) as an element-wise function, from a
    pairwise one (``np.maximum``, ``xp.minimum``)."""

    def reduce(first: Any, *rest: Any) -> Any:
        for value in rest:
            first = pairwise(first, value)
        return first

    return reduce


class PlanError(ValueError):
    """A plan (or its JSON) that is not what :class:`SolverPlan` allows."""


@dataclass(frozen=True)
class GeneratedFunction:
    """One function of a generator, twice: for a compiled scalar loop and for whole arrays.

    Attributes
    ----------
    name : str
        One of :data:`GENERATOR_FUNCTIONS`.
    select_source : str
        ``def <name>(x, L, u)`` with every branch computed and chosen by ``xp.where`` (a select, which a compiler
        can vectorise); exp, log, sqrt from ``xp``, anything else from ``math``.
    closed, taylor, far : str or None
        For whole arrays: ``def closed(x, L, u)``, the closed expression; ``def taylor(x)``, its Taylor polynomial
        for :math:`|x| <` ``taylor_radius`` (None where the closed form cannot cancel); ``def far(t, y, L, x)``,
        the form in :math:`t = 1/u`, :math:`y = 1 - t` for :math:`x >` ``far_x`` (r side only, else None).
    at_infinity : float or None
        The limit :math:`u \to \\infty` where ``far`` is NaN at :math:`u = \\infty` (r side only).
    """

    name: str
    select_source: str
    closed: str
    taylor: str | None
    far: str | None
    at_infinity: float | None


@dataclass(frozen=True)
class SolverPlan:
    """What binds a divergence's solver to a backend (module docstring).  ``key`` is computed, not given."""

    name: str
    formula: str
    kind: str
    functions: tuple[GeneratedFunction, ...] = ()
    f_at_zero: float = 0.0
    slope_at_infinity: float = 0.0
    f2: float = 0.0
    kink: float = 0.0
    taylor_radius: float = 0.0
    far_x: float = 0.0
    seed_key: str = ""
    key: str = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check(self)
        object.__setattr__(self, "key", hashlib.sha256(_canonical(self._content()).encode()).hexdigest()[:24])

    def _content(self) -> dict:
        content = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        content["functions"] = [asdict(fn) for fn in self.functions]
        return content

    def to_json(self) -> str:
        """The plan as JSON text, with its format and a digest of its content (checked by :meth:`from_json`)."""
        content = self._content()
        digest = hashlib.sha256(_canonical(content).encode()).hexdigest()
        return json.dumps({"format": PLAN_FORMAT, "plan": content, "sha256": digest}, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SolverPlan:
        """The plan written by :meth:`to_json`; :class:`PlanError` for anything else (other format, damaged,
        truncated or edited text, a source that is not plain arithmetic)."""
        try:
            document = json.loads(text)
            content, digest = document["plan"], document["sha256"]
            if document["format"] != PLAN_FORMAT:
                raise PlanError(f"plan format {document['format']!r}, expected {PLAN_FORMAT}")
            if hashlib.sha256(_canonical(content).encode()).hexdigest() != digest:
                raise PlanError("the plan's digest does not match its content")
            names = {f.name for f in fields(cls) if f.init}
            if set(content) != names:
                raise PlanError(f"plan fields {sorted(content)}, expected {sorted(names)}")
            functions = tuple(GeneratedFunction(**_function_fields(fn)) for fn in content["functions"])
            return cls(**{**content, "functions": functions})
        except PlanError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise PlanError(f"not a plan: {type(error).__name__}: {error}") from error


def _function_fields(fn: object) -> dict:
    if not isinstance(fn, dict) or set(fn) != {f.name for f in fields(GeneratedFunction)}:
        raise PlanError(f"not a generated function: {fn!r:.80}")
    return fn


def _canonical(content: dict) -> str:
    return json.dumps(content, sort_keys=True, separators=(",", ":"))


def _check(plan: SolverPlan) -> None:
    """Types and values of every field (a plan from a file is hostile input)."""
    for name in ("name", "formula", "kind", "seed_key"):
        if not isinstance(getattr(plan, name), str):
            raise PlanError(f"plan field {name!r} must be a string, got {getattr(plan, name)!r:.80}")
    if plan.kind not in SOLVER_KINDS:
        raise PlanError(f"plan kind {plan.kind!r}, expected one of {SOLVER_KINDS}")
    for name in ("f_at_zero", "slope_at_infinity", "f2", "kink", "taylor_radius", "far_x"):
        value = getattr(plan, name)
        if not isinstance(value, float):
            raise PlanError(f"plan field {name!r} must be a float, got {value!r:.80}")
    if not isinstance(plan.functions, tuple):
        raise PlanError("plan field 'functions' must be a tuple")
    expected = GENERATOR_FUNCTIONS if plan.kind == "generic" else ()
    if tuple(getattr(fn, "name", None) for fn in plan.functions) != expected:
        raise PlanError(f"a {plan.kind} plan has the functions {expected}")
    for fn in plan.functions:
        _check_function(fn)


def _check_function(fn: GeneratedFunction) -> None:
    if fn.at_infinity is not None and not isinstance(fn.at_infinity, float):
        raise PlanError(f"{fn.name}: at_infinity must be a float or None")
    check_source(fn.select_source, fn.name, ("x", "L", "u"))
    check_source(fn.closed, "closed", ("x", "L", "u"))
    if fn.taylor is not None:
        check_source(fn.taylor, "taylor", ("x",))
    if fn.far is not None:
        check_source(fn.far, "far", ("t", "y", "L", "x"))


#: The syntax a generated function may use: arithmetic, comparisons, selects, calls of allowed names.
_ALLOWED_NODES = (ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Assign, ast.Return, ast.Name, ast.Load,
                  ast.Store, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.IfExp, ast.Call,
                  ast.Attribute, ast.Tuple, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)  # fmt: skip


def check_source(source: object, name: str, args: tuple[str, ...]) -> None:
    """Refuse (:class:`PlanError`) ``source`` unless it is one ``def name(*args)`` of plain arithmetic: names it
    assigns or receives, :data:`VECTORISED_NAMES`, attributes of ``xp`` or ``math`` (not private), numbers."""
    if not isinstance(source, str):
        raise PlanError(f"{name}: the source must be a string")
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        raise PlanError(f"{name}: the source does not parse: {error}") from error
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise PlanError(f"{name}: the source must be one function definition")
    function = tree.body[0]
    received = tuple(a.arg for a in function.args.args)
    if function.name != name or received != args or function.decorator_list or function.args.defaults:
        raise PlanError(f"{name}: expected def {name}({', '.join(args)}), got def {function.name}{received}")
    known = set(args) | set(VECTORISED_NAMES) | {"math"}
    known |= {t.id for node in ast.walk(function) if isinstance(node, ast.Assign) for t in node.targets
              if isinstance(t, ast.Name)}  # fmt: skip
    infinities = [node for node in ast.walk(function) if _is_infinity(node)]  # float("inf"): SymPy's print of oo
    skipped = {id(node.func) for node in infinities} | {id(node.args[0]) for node in infinities}
    for node in ast.walk(function):
        if id(node) in skipped:
            continue
        if not isinstance(node, _ALLOWED_NODES):
            raise PlanError(f"{name}: {type(node).__name__} is not allowed in a generated function")
        if isinstance(node, ast.Name) and node.id not in known:
            raise PlanError(f"{name}: unknown name {node.id!r}")
        if isinstance(node, ast.Attribute) and not (
            isinstance(node.value, ast.Name) and node.value.id in ("xp", "math") and not node.attr.startswith("_")
        ):
            raise PlanError(f"{name}: attribute {ast.unparse(node)!r} is not allowed")
        if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float)):
            raise PlanError(f"{name}: constant {node.value!r:.40} is not a number")


def _is_infinity(node: ast.AST) -> bool:
    """``float("inf")``, ``float("-inf")`` or ``float("nan")``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float"
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in ("inf", "-inf", "nan"))  # fmt: skip

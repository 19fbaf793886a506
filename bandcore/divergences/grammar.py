r"""The one grammar for generators: a formula in ``u`` parsed into a small expression tree, never evaluated.

A formula is read with :func:`ast.parse` and rebuilt node by node from a whitelist into plain tuples; no
Python is evaluated and nothing reaches ``sympify``/``eval``.  The tree is then printed back in one canonical
spelling (:func:`to_text`), evaluated numerically with any namespace (:func:`evaluate`: NumPy, mpmath, SymPy),
and its size is bounded before anything else sees it.

Allowed: the variable ``u``; numbers (0 or :math:`10^{-40} \le |x| \le 10^6`, kept exact as fractions);
``+ - * / **`` (``^`` is read as ``**``); the constants ``pi``, ``E`` (``e``); the functions ``log`` (``ln``),
``exp``, ``sqrt``, ``cbrt``, ``abs`` (``Abs``), ``sinh``, ``cosh``, ``tanh``, ``asinh``, ``acosh``, ``atanh``,
``min``/``max`` (two or more arguments) and ``where(cond, a, b)`` (``a`` where ``cond`` holds, else ``b``;
``cond`` compares two expressions with ``< <= > >=``).

Limits (checked before any tree is built; each refusal names the limit): :data:`MAX_LENGTH` characters,
:data:`MAX_NODES` syntax nodes, nesting depth :data:`MAX_DEPTH`, constant exponents :math:`|k| \le` 64, and at
most :data:`MAX_TRANSCENDENTAL_DEPTH` nested transcendental functions (``exp(exp(exp(u)))`` is refused).

Tree nodes (tuples): ``("u",)``, ``("num", Fraction)``, ``("const", "pi" | "E")``, ``("neg", a)``,
``("add" | "sub" | "mul" | "div" | "pow", a, b)``, ``("call", name, (args...))``,
``("where", (op, a, b), then, otherwise)`` with ``op`` in ``lt le gt ge``.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

__all__ = ["FUNCTIONS", "GeneratorError", "Node", "evaluate", "parse", "to_text"]

Node = tuple

MAX_LENGTH = 400
MAX_NODES = 200
MAX_DEPTH = 64
MAX_EXPONENT = 64
MAX_TRANSCENDENTAL_DEPTH = 3
_LITERAL_MAX = 10**6
_LITERAL_MIN = Fraction(1, 10**40)


class GeneratorError(ValueError):
    """A generator string or expression that is unsafe, malformed, or not a valid f-divergence generator."""


#: function name -> (canonical name, number of arguments (0: two or more), transcendental)
FUNCTIONS: dict[str, tuple[str, int, bool]] = {
    "log": ("log", 1, True),
    "ln": ("log", 1, True),
    "exp": ("exp", 1, True),
    "sqrt": ("sqrt", 1, False),
    "cbrt": ("cbrt", 1, False),
    "abs": ("abs", 1, False),
    "Abs": ("abs", 1, False),
    "sinh": ("sinh", 1, True),
    "cosh": ("cosh", 1, True),
    "tanh": ("tanh", 1, True),
    "asinh": ("asinh", 1, True),
    "acosh": ("acosh", 1, True),
    "atanh": ("atanh", 1, True),
    "min": ("min", 0, False),
    "Min": ("min", 0, False),
    "max": ("max", 0, False),
    "Max": ("max", 0, False),
}
_CONSTANTS = {"pi": "pi", "E": "E", "e": "E"}
_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow"}
_COMPARE = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge"}


def parse(text: Any) -> Node:
    """Parse a generator ``f(u)`` from a string into a tree, without evaluating any Python.

    Raises :class:`TypeError` for anything but a ``str`` and :class:`GeneratorError` for text outside the
    grammar or its limits.
    """
    if not isinstance(text, str):
        raise TypeError(f"a generator formula must be a str, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise GeneratorError(f"formula is {len(text)} characters long; at most {MAX_LENGTH} are accepted")
    source = text.replace("^", "**").strip()
    if not source:
        raise GeneratorError("formula is empty; give f(u), e.g. '(u-1)**2'")
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError) as err:
        raise GeneratorError(f"formula {text!r} is not a valid expression: {getattr(err, 'msg', err)}") from None
    except (RecursionError, MemoryError):
        raise GeneratorError(f"formula is nested too deeply (at most {MAX_DEPTH} levels)") from None
    _check_size(tree.body)
    tree = _fold(_build(tree.body, source))
    _check_numbers(tree)
    return tree


def _check_numbers(node: Node) -> None:
    """Every number of the folded tree is 0 or 1e-40 <= |x| <= 1e6 (so ``1/3`` written with 16 digits is fine)."""
    kind = node[0]
    if kind == "num":
        value = node[1]
        if value and not (_LITERAL_MIN <= abs(value) <= _LITERAL_MAX):
            raise GeneratorError(f"number {float(value):.6g} is outside 1e-40 <= |x| <= 1e6")
    elif kind == "call":
        for arg in node[2]:
            _check_numbers(arg)
    elif kind == "where":
        for child in (node[1][1], node[1][2], node[2], node[3]):
            _check_numbers(child)
    elif kind not in ("u", "const"):
        for child in node[1:]:
            _check_numbers(child)


def _check_size(root: ast.AST) -> None:
    """Node count, depth and transcendental nesting, iteratively (a deep tree never meets the recursion)."""
    count = 0
    stack = [(root, 1, 0)]
    while stack:
        node, depth, transcendental = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise GeneratorError(f"formula is too large (more than {MAX_NODES} syntax nodes)")
        if depth > MAX_DEPTH:
            raise GeneratorError(f"formula is nested too deeply (more than {MAX_DEPTH} levels)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            transcendental += FUNCTIONS.get(node.func.id, ("", 0, False))[2]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            transcendental += any(isinstance(n, ast.Name) and n.id == "u" for n in ast.walk(node.right))
        if transcendental > MAX_TRANSCENDENTAL_DEPTH:
            raise GeneratorError(
                f"formula nests transcendental functions more than {MAX_TRANSCENDENTAL_DEPTH} deep"
            )
        stack.extend((child, depth + 1, transcendental) for child in ast.iter_child_nodes(node))


def _piece(node: ast.AST, source: str) -> str:
    return ast.get_source_segment(source, node) or type(node).__name__


def _build(node: ast.AST, source: str) -> Node:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GeneratorError(f"only numbers are allowed as constants, not {_piece(node, source)!r}")
        if not math.isfinite(value):
            raise GeneratorError(f"numeric literal {_piece(node, source)!r} is not finite")
        if isinstance(value, int) and value.bit_length() > 140:  # 42 digits: enough for any exact fraction
            raise GeneratorError(f"numeric literal {_piece(node, source)[:40]!r} has too many digits")
        return ("num", Fraction(value) if isinstance(value, int) else Fraction(repr(value)))
    if isinstance(node, ast.Name):
        if node.id == "u":
            return ("u",)
        if node.id in _CONSTANTS:
            return ("const", _CONSTANTS[node.id])
        raise GeneratorError(f"unknown name {node.id!r}: the only variable is 'u' (constants: pi, E)")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _build(node.operand, source)
        return ("neg", operand) if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _build(node.left, source), _build(node.right, source)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right, _piece(node, source))
        return (_BINARY[type(node.op)], left, right)
    if isinstance(node, ast.Call):
        return _build_call(node, source)
    raise GeneratorError(f"{_piece(node, source)!r} is not allowed in a generator ({type(node).__name__})")


def _build_call(node: ast.Call, source: str) -> Node:
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
        raise GeneratorError(f"call {_piece(node, source)!r}: keyword and starred arguments are not allowed")
    if name == "where":
        if len(node.args) != 3:
            raise GeneratorError("where(cond, a, b) takes exactly three arguments")
        cond = node.args[0]
        if not (isinstance(cond, ast.Compare) and len(cond.ops) == 1 and type(cond.ops[0]) in _COMPARE):
            raise GeneratorError(f"the condition of where() must compare two expressions, got {_piece(cond, source)!r}")
        test = (_COMPARE[type(cond.ops[0])], _build(cond.left, source), _build(cond.comparators[0], source))
        return ("where", test, _build(node.args[1], source), _build(node.args[2], source))
    if name not in FUNCTIONS:
        allowed = ", ".join(sorted({*FUNCTIONS, "where"}))
        raise GeneratorError(f"call {_piece(node, source)!r} is not allowed; allowed functions: {allowed}")
    canonical, arity, _ = FUNCTIONS[name]
    if (arity and len(node.args) != arity) or (not arity and len(node.args) < 2):
        wanted = "exactly one argument" if arity == 1 else "two or more arguments"
        raise GeneratorError(f"function {name!r} takes {wanted}, got {len(node.args)}")
    return ("call", canonical, tuple(_build(a, source) for a in node.args))


def _constant_value(node: Node) -> float | None:
    try:
        value = evaluate(node, MATH_NAMESPACE, None)
    except (ValueError, OverflowError, ZeroDivisionError, TypeError):
        return math.nan
    return float(value) if isinstance(value, (int, float)) else None


def _has_u(node: Node) -> bool:
    kind = node[0]
    if kind in ("num", "const"):
        return False
    if kind == "u":
        return True
    if kind == "neg":
        return _has_u(node[1])
    if kind == "call":
        return any(_has_u(a) for a in node[2])
    if kind == "where":
        return any(_has_u(n) for n in (node[1][1], node[1][2], node[2], node[3]))
    return _has_u(node[1]) or _has_u(node[2])


def _check_power(base: Node, exponent: Node, piece: str) -> None:
    if _has_u(exponent):
        return  # a variable exponent counts as transcendental nesting (checked on the syntax tree)
    k = _constant_value(exponent)
    if k is None or not math.isfinite(k) or abs(k) > MAX_EXPONENT:
        raise GeneratorError(f"exponent in {piece!r} is too large or not finite (|exponent| <= {MAX_EXPONENT})")
    if not _has_u(base):
        b = _constant_value(base)
        if b is None or not math.isfinite(b) or (b != 0 and abs(k * math.log(abs(b))) > 700):
            raise GeneratorError(f"constant {piece!r} is outside the double-precision range")


def _fold(node: Node) -> Node:
    """Fold ``-number`` and ``number / number`` into one exact number (so that printing round-trips)."""
    kind = node[0]
    if kind == "neg":
        inner = _fold(node[1])
        return ("num", -inner[1]) if inner[0] == "num" else ("neg", inner)
    if kind in ("add", "sub", "mul", "div", "pow"):
        a, b = _fold(node[1]), _fold(node[2])
        if kind == "div" and a[0] == "num" and b[0] == "num" and b[1] != 0:
            return ("num", a[1] / b[1])
        return (kind, a, b)
    if kind == "call":
        return ("call", node[1], tuple(_fold(a) for a in node[2]))
    if kind == "where":
        op, a, b = node[1]
        return ("where", (op, _fold(a), _fold(b)), _fold(node[2]), _fold(node[3]))
    return node


# --------------------------------------------------------------------------------------------------------
# Printing (the canonical spelling)
# --------------------------------------------------------------------------------------------------------

_PRECEDENCE = {"add": 1, "sub": 1, "mul": 2, "div": 2, "neg": 3, "pow": 4}
_SYMBOL = {"add": " + ", "sub": " - ", "mul": "*", "div": "/", "pow": "**"}
_COMPARE_SYMBOL = {"lt": " < ", "le": " <= ", "gt": " > ", "ge": " >= "}


def to_text(node: Node) -> str:
    """The canonical spelling of a tree: ``parse(to_text(t)) == t`` for every tree :func:`parse` returns."""
    return _text(node)[0]


def _text(node: Node) -> tuple[str, int]:
    kind = node[0]
    if kind == "u":
        return "u", 9
    if kind == "const":
        return node[1], 9
    if kind == "num":
        value: Fraction = node[1]
        text = str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
        precedence = 9 if value.denominator == 1 and value >= 0 else (2 if value >= 0 else 0)
        return text, precedence
    if kind == "neg":
        inner, p = _text(node[1])
        return "-" + (inner if p > 3 else f"({inner})"), 3
    if kind in _SYMBOL:
        p = _PRECEDENCE[kind]
        left, pl = _text(node[1])
        right, pr = _text(node[2])
        if kind == "pow":  # right-associative; a negative base needs parentheses
            left = left if pl > p else f"({left})"
            right = right if pr >= p else f"({right})"
        else:
            left = left if pl >= p else f"({left})"
            right = right if pr > p else f"({right})"
        return left + _SYMBOL[kind] + right, p
    if kind == "call":
        return f"{node[1]}({', '.join(_text(a)[0] for a in node[2])})", 9
    op, a, b = node[1]
    cond = _text(a)[0] + _COMPARE_SYMBOL[op] + _text(b)[0]
    return f"where({cond}, {_text(node[2])[0]}, {_text(node[3])[0]})", 9


# --------------------------------------------------------------------------------------------------------
# Numeric evaluation
# --------------------------------------------------------------------------------------------------------


def evaluate(node: Node, namespace: Mapping[str, Callable[..., Any]], u: Any) -> Any:
    """The tree's value at ``u`` with the functions of ``namespace``.

    ``namespace`` maps the function names of :data:`FUNCTIONS` (canonical), ``"number"`` (Fraction -> value),
    ``"pi"``, ``"E"``, ``"where"`` (cond, a, b) and the comparisons ``lt le gt ge``; arithmetic uses the
    operators of the values themselves (NumPy arrays, mpmath numbers, SymPy expressions).
    """
    kind = node[0]
    if kind == "u":
        return u
    if kind == "num":
        return namespace["number"](node[1])
    if kind == "const":
        return namespace[node[1]]
    if kind == "neg":
        return -evaluate(node[1], namespace, u)
    if kind in _SYMBOL:
        a, b = evaluate(node[1], namespace, u), evaluate(node[2], namespace, u)
        if kind == "add":
            return a + b
        if kind == "sub":
            return a - b
        if kind == "mul":
            return a * b
        if kind == "div":
            return a / b
        return a**b
    if kind == "call":
        args = [evaluate(a, namespace, u) for a in node[2]]
        return namespace[node[1]](*args)
    op, a, b = node[1]
    cond = namespace[op](evaluate(a, namespace, u), evaluate(b, namespace, u))
    return namespace["where"](cond, evaluate(node[2], namespace, u), evaluate(node[3], namespace, u))


def _math_min(*args: float) -> float:
    return min(args)


def _math_max(*args: float) -> float:
    return max(args)


#: Plain-float evaluation (used for constant folding checks).
MATH_NAMESPACE: dict[str, Any] = {
    "number": float,
    "pi": math.pi,
    "E": math.e,
    "log": math.log,
    "exp": math.exp,
    "sqrt": math.sqrt,
    "cbrt": lambda x: math.copysign(abs(x) ** (1 / 3), x),
    "abs": abs,
    "sinh": math.sinh,
    "cosh": math.cosh,
    "tanh": math.tanh,
    "asinh": math.asinh,
    "acosh": math.acosh,
    "atanh": math.atanh,
    "min": _math_min,
    "max": _math_max,
    "where": lambda c, a, b: a if c else b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
}

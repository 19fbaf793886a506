r"""A plan's generated functions with their transcendental calls computed once per point, for NumPy and torch.

The functions of one side of a generic plan (φ and φ′ at r's point, f̃ and its slope at s's) are evaluated one
after the other at the same point (x, L, u), and their sources, derived one by one, repeat the same calls:
α = 0.7's four r-side forms each take ``exp(L/10)`` and ``expm1(L/10)``, js's ``log(u/2 + 1/2)``, Hellinger's
``sqrt(u)``.  On whole arrays each call is a pass over the tokens (on torch, 10k float64 values: 15–25 µs), so
:func:`share_calls` rewrites a source so that each such call looks its value up in a dictionary of the point
(``vectorised._PointCache``) and computes it only when missing.

A call is shared when its function is one of :data:`SHARED` and its argument depends on the function's
parameters only; a local variable in it stands for its definition (the body is straight-line code, each local
assigned once), so ``x0 = u/2; log(x0 + 1/2)`` and ``log(u/2 + 1/2)`` are the same call.  Its key is its text
with each local replaced by a digest of the local's own key (so keys stay short however deep the definitions
nest).  The parameters keep one meaning across a plan's forms (x = u − 1, L = log u, u; the far form's t = 1/u
and y = 1 − t), so a key names one value at one point.  A source that assigns a parameter, a name of the
namespace or a local twice shares nothing.
"""

from __future__ import annotations

import ast
import copy
import hashlib
from collections.abc import Callable
from typing import Any

__all__ = ["HELPER", "MEMO", "SHARED", "share_calls", "shared"]

#: The calls worth sharing: one pass of a transcendental each
SHARED = frozenset({"exp", "expm1", "log", "log1p", "sqrt", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh"})
#: The parameter added to a rewritten function: the point's dictionary of shared values (None: nothing shared)
MEMO = "shared_values"
#: The helper the rewritten calls go through (bound in the functions' namespace)
HELPER = "shared"


def shared(memo: dict | None, key: str, compute: Callable[[], Any]) -> Any:
    """``memo[key]``, computed by ``compute()`` and kept there when missing; ``compute()`` when ``memo`` is None."""
    if memo is None:
        return compute()
    value = memo.get(key)
    if value is None:
        value = memo[key] = compute()
    return value


def share_calls(source: str, constants: frozenset[str]) -> tuple[str, int]:
    """(``source`` rewritten, number of calls shared): every shareable call (module docstring) of its one function
    becomes ``shared(shared_values, key, lambda: call)``, and the function gets the last parameter
    ``shared_values=None`` (also where it shares nothing: one signature for all).  ``constants``: the names of the
    namespace a key may contain besides the parameters (functions and constants: one meaning everywhere)."""
    tree = ast.parse(source)
    function = tree.body[0]
    params = {a.arg for a in function.args.args}
    assigned = [t.id for node in ast.walk(function) if isinstance(node, ast.Assign) for t in node.targets
                if isinstance(t, ast.Name)]  # fmt: skip
    reserved = {MEMO, HELPER}
    safe = len(assigned) == len(set(assigned)) and not set(assigned) & (params | SHARED | constants | reserved) \
        and not params & reserved
    rewrite = _Rewrite(params | constants)
    if safe:
        for statement in function.body:
            rewrite.visit(statement)
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                rewrite.define(statement.targets[0].id, statement.value)
    function.args.args.append(ast.arg(MEMO))
    function.args.defaults.append(ast.Constant(None))
    return ast.unparse(ast.fix_missing_locations(tree)), rewrite.count


class _Rewrite(ast.NodeTransformer):
    """The rewrite of :func:`share_calls`, statement by statement (locals defined as it goes)."""

    def __init__(self, known: set[str]) -> None:
        self.known, self.keys, self.count = known, {}, 0

    def key_of(self, node: ast.AST) -> str | None:
        """The key of an expression (its text, locals replaced by their digests), or None where it depends on a
        name that is neither known nor a shareable local."""
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if any(name not in self.known and self.keys.get(name) is None for name in names):
            return None
        expression = _Digests(self.keys).visit(copy.deepcopy(node))
        return ast.unparse(expression)

    def define(self, name: str, value: ast.AST) -> None:
        key = self.key_of(value)
        self.keys[name] = None if key is None else hashlib.sha256(key.encode()).hexdigest()[:16]

    def visit_Call(self, node: ast.Call) -> ast.AST:
        key = self.key_of(node) if isinstance(node.func, ast.Name) and node.func.id in SHARED else None
        node = self.generic_visit(node)
        if key is None:
            return node
        self.count += 1
        compute = ast.Lambda(ast.arguments([], [], None, [], [], None, []), node)
        arguments = [ast.Name(MEMO, ast.Load()), ast.Constant(key), compute]
        return ast.copy_location(ast.Call(ast.Name(HELPER, ast.Load()), arguments, []), node)


class _Digests(ast.NodeTransformer):
    """Each local replaced by the name ``_<digest>`` of its key."""

    def __init__(self, keys: dict[str, str | None]) -> None:
        self.keys = keys

    def visit_Name(self, node: ast.Name) -> ast.AST:
        digest = self.keys.get(node.id)
        return ast.Name(f"_{digest}", ast.Load()) if digest else node

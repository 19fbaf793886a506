"""The rewrite that shares a plan function's transcendental calls at a point (:func:`share_calls`): which calls it
shares, under which keys, and that the rewritten function computes what the source does."""

from __future__ import annotations

import ast
import math

import numpy as np
import pytest

from bandcore.kernels.shared_calls import share_calls, shared

CONSTANTS = frozenset({"exp", "expm1", "log", "log1p", "sqrt", "pi", "E", "xp", "abs"})


def _keys(source: str) -> list[str]:
    rewritten, _ = share_calls(source, CONSTANTS)
    return [node.args[1].value for node in ast.walk(ast.parse(rewritten))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "shared"]  # fmt: skip


def _run(source: str, memo: dict | None, *args: float) -> float:
    rewritten, _ = share_calls(source, CONSTANTS)
    scope = {"exp": math.exp, "expm1": math.expm1, "log": math.log, "sqrt": math.sqrt, "shared": shared}
    exec(rewritten, scope)
    name = ast.parse(source).body[0].name
    return scope[name](*args, memo)


def test_a_call_through_a_local_and_written_out_share_one_key():
    inline = "def closed(x, L, u):\n    return log(1/2*u + 1/2)*u\n"
    local = "def closed(x, L, u):\n    x0 = 1/2*u\n    return log(x0 + 1/2)\n"
    other = "def closed(x, L, u):\n    x0 = 1/2*L\n    return log(x0 + 1/2)\n"
    assert len(_keys(inline)) == len(_keys(local)) == len(_keys(other)) == 1
    assert _keys(local) != _keys(other)  # the same text, locals of other values: other keys
    local_again = "def far(t, y, L, x):\n    x5 = 1/2*u\n    return -log(x5 + 1/2)\n".replace("u", "t")
    assert _keys(local_again) != _keys(local)  # t is not u


def test_keys_stay_short_however_deep_the_locals_nest():
    body = [f"    x{k} = x{k - 1}*x{k - 1} + x{k - 1}" for k in range(1, 60)]
    source = "\n".join(["def closed(x, L, u):", "    x0 = u + L", *body, "    return exp(x59)\n"])
    (key,) = _keys(source)
    assert len(key) < 40


@pytest.mark.parametrize("source", [
    "def closed(x, L, u):\n    x0 = u\n    x0 = x0*2\n    return exp(x0)\n",       # a local assigned twice
    "def closed(x, L, u):\n    u = u*2\n    return exp(u)\n",                       # a parameter assigned
    "def closed(x, L, u):\n    log = u*2\n    return exp(log)\n",                   # a name of the namespace assigned
    "def closed(x, L, u):\n    return exp(z)\n",                                    # a name neither known nor local
])  # fmt: skip
def test_a_source_it_cannot_read_safely_shares_nothing(source):
    assert share_calls(source, CONSTANTS)[1] == 0
    assert "shared_values=None" in share_calls(source, CONSTANTS)[0]  # one signature for all


def test_the_rewritten_function_computes_what_the_source_does_and_shares():
    source = "def closed(x, L, u):\n    x0 = exp(1/10*L)\n    return x0*expm1(1/10*L)**2 + sqrt(u)*exp(1/10*L)\n"
    plain = {"exp": math.exp, "expm1": math.expm1, "sqrt": math.sqrt}
    exec(source, plain)
    memo: dict = {}
    assert _run(source, memo, 0.5, 1.7, 2.0) == plain["closed"](0.5, 1.7, 2.0)
    assert sorted(memo) == ["exp(1 / 10 * L)", "expm1(1 / 10 * L)", "sqrt(u)"]
    memo["exp(1 / 10 * L)"] = 0.0  # what a point's dictionary holds is what the next function reads
    assert _run(source, memo, 0.5, 1.7, 2.0) == 0.0
    assert _run(source, None, 0.5, 1.7, 2.0) == plain["closed"](0.5, 1.7, 2.0)  # no dictionary: computed anew


def test_shared_computes_once_per_key():
    calls = []
    memo: dict = {}
    for _ in range(3):
        value = shared(memo, "k", lambda: calls.append(1) or np.arange(3.0))
    assert len(calls) == 1 and value.tolist() == [0.0, 1.0, 2.0]
    assert shared(None, "k", lambda: 7.0) == 7.0

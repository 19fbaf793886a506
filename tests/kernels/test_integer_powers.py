"""Integer powers on whole arrays: the rewrite of the sources (:func:`integer_powers`, ``a ** n`` for an integer
literal 3 <= n <= 32 becomes ``xp.integer_power(a, n)``) and the operation itself on NumPy and torch, which must
be as accurate as the compiled backends' expansion (below n ulp) and keep signs, zeros, infinities and NaN."""

from __future__ import annotations

import ast
import math
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from bandcore.kernels.ops import numpy_ops
from bandcore.kernels.sources import INTEGER_POWERS, compile_for, integer_powers

SOURCE = """
def f(x):
    return x**3, x**2, x**7.0, (x + 1)**32, x**33, 2**x, x**-3, x**(3), x**True
"""


def _namespaces():
    """(name, namespace, array maker) of NumPy, and of torch where it is installed."""
    yield "numpy", numpy_ops, np.asarray
    try:
        import torch
    except ImportError:
        return
    from bandcore.kernels.ops import torch_ops

    yield "torch", torch_ops(), lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64))


def test_rewrite_takes_the_integer_literals_from_3_to_32_only():
    tree = integer_powers(SOURCE)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert sorted(call.args[1].value for call in calls) == [3, 3, 32]
    assert {call.lineno for call in calls} == {3}
    recorded = []
    scope = {"xp": SimpleNamespace(integer_power=lambda a, n: recorded.append(n) or a**n)}
    exec(compile(tree, "<test>", "exec"), scope)
    plain = {}
    exec(SOURCE, plain)
    assert scope["f"](1.5) == plain["f"](1.5) and recorded == [3, 32, 3]


def test_compile_for_rewrites_only_for_a_namespace_with_the_operation():
    bare = {"xp": SimpleNamespace()}
    exec(compile_for(bare["xp"], SOURCE, "<test>"), bare)
    assert bare["f"](2.0)[0] == 8.0  # no integer_power: the source as written


@pytest.mark.parametrize("n", list(INTEGER_POWERS))
def test_integer_power_is_within_n_ulp(n):
    rng = np.random.default_rng(n)
    values = rng.uniform(0.5, 2.0, 200) * np.where(rng.random(200) < 0.3, -1.0, 1.0)
    for name, xp, array in _namespaces():
        got = np.asarray(xp.integer_power(array(values), n), dtype=np.float64)
        for value, power in zip(values.tolist(), got.tolist(), strict=True):
            exact = Fraction(value) ** n
            assert abs(Fraction(power) - exact) <= abs(exact) * n * Fraction(2) ** -53, (name, n, value)


def test_integer_power_keeps_the_special_values():
    special = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e200, -1e-200, 1.0, -1.0]
    for name, xp, array in _namespaces():
        for n in (3, 4, 7, 32):
            with np.errstate(all="ignore"):  # as the solvers run NumPy: 1e200**3 overflows to inf
                got = np.asarray(xp.integer_power(array(special), n), dtype=np.float64)
                want = np.power(np.asarray(special), float(n))
            np.testing.assert_array_equal(got, want, err_msg=f"{name}, n = {n}")
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=f"{name}, n = {n}")

"""The torch namespace's own operations: the fused multiply-adds (the rewrite of the sources,
:func:`fuse_multiply_adds`, and the operation it calls, ``torch_ops().muladd``, which must compute what the
expression it replaces computes) and the numbers it makes tensors of once (``where``, ``minimum``, ``maximum``)."""

from __future__ import annotations

import ast
import math
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from bandcore.kernels.sources import fuse_multiply_adds

torch = pytest.importorskip("torch")

SOURCE = """
def f(x, c, k):
    horner = x*(x*(x*((3/8)*x - 5/16) + 1/4) - 1/2) + 1
    mixed = c - x*k
    left = x*k + c
    kept = x*k - c
    power = x**2*(1/4 - x)
    return horner, mixed, left, kept, power
"""


def _recorded(source: str):
    """``f`` of ``source`` rewritten, with an ``xp.muladd`` that counts its calls and computes in Python."""
    calls = []

    def muladd(c, a, b, sign=1.0):
        calls.append(sign)
        return c + a * b if sign == 1.0 else c - a * b

    scope = {"xp": SimpleNamespace(muladd=muladd)}
    exec(compile(fuse_multiply_adds(source), "<test>", "exec"), scope)
    return scope["f"], calls


def test_rewrite_fuses_each_form_and_keeps_the_values():
    fused, calls = _recorded(SOURCE)
    plain = {}
    exec(SOURCE, plain)
    for x, c, k in [(0.3, 2.0, -1.5), (-7.25, 0.0, 3.0), (1e-3, -4.0, 0.5)]:
        assert fused(x, c, k) == plain["f"](x, c, k)
    # per call: the Horner polynomial's 4 levels (two of them "a*b - number"), c - x*k, x*k + c, and 1/4 - x's
    # product with x**2 is no sum; x*k - c (c not a number) stays as written
    assert len(calls) == 3 * 6
    assert calls[:6].count(-1.0) == 1  # c - x*k; "a*b - number" becomes muladd(-number, a, b)


def test_rewrite_keeps_line_numbers():
    tree = fuse_multiply_adds(SOURCE)
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    assert calls and {node.lineno for node in calls} == {3, 4, 5}


def _exact(c: float, a: float, b: float, sign: float) -> Fraction:
    return Fraction(c) + Fraction(sign) * Fraction(a) * Fraction(b)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_muladd_is_as_accurate_as_the_expression(sign):
    from bandcore.kernels.ops import torch_ops

    xp = torch_ops()
    rng = np.random.default_rng(0)
    a, b, c = (torch.from_numpy(rng.normal(size=300) * 10.0 ** rng.integers(-3, 4, 300)) for _ in range(3))
    for got in (xp.muladd(c, a, b, sign), xp.muladd(0.3, a, b, sign), xp.muladd(c, a, 2.5, sign),
                xp.muladd(-1.75, 2.5, a, sign)):
        assert got.dtype == torch.float64 and got.shape == (300,)
    fused = xp.muladd(c, a, b, sign)
    for i in range(300):  # within the expression's error plus half an ulp: one rounding (FMA) or the same two
        ai, bi, ci = float(a[i]), float(b[i]), float(c[i])
        exact = _exact(ci, ai, bi, sign)
        got = float(fused[i])
        written = ci + ai * bi if sign == 1 else ci - ai * bi
        half_ulp = Fraction(math.ulp(float(exact))) / 2
        assert abs(Fraction(got) - exact) <= abs(Fraction(written) - exact) + half_ulp


@pytest.mark.parametrize(
    "c, a, b",
    [
        (0, torch.tensor([True, False]), 3),  # a bool tensor times an int: integer arithmetic, as written
        (1, torch.tensor([2, 5]), 4),  # int tensors
        (0.5, 2.0, 3.0),  # numbers only
        (torch.tensor([1.0, 2.0], dtype=torch.float32), torch.tensor([1.0, 2.0], dtype=torch.float64), 2.0),
        (torch.tensor(2.0, dtype=torch.float64), torch.tensor([1.5, -2.0], dtype=torch.float64), True),
    ],
)
def test_muladd_falls_back_to_the_expression(c, a, b):
    from bandcore.kernels.ops import torch_ops

    got = torch_ops().muladd(c, a, b)
    written = c + a * b
    if isinstance(written, torch.Tensor):
        assert got.dtype == written.dtype and torch.equal(got, written)
    else:
        assert got == written


def test_muladd_numbers_become_one_constant_per_dtype():
    from bandcore.kernels.ops import torch_ops

    xp = torch_ops()
    x32 = torch.tensor([1.0, 2.0], dtype=torch.float32)
    x64 = x32.double()
    assert xp.muladd(0.25, x32, x32).dtype == torch.float32
    assert xp.muladd(0.25, x64, x64).dtype == torch.float64
    assert torch.equal(xp.muladd(0.25, x64, x64), torch.tensor([1.25, 4.25], dtype=torch.float64))


def test_numbers_made_tensors_once_keep_their_value_sign_and_dtype():
    from bandcore.kernels.ops import torch_ops

    xp = torch_ops()
    cond = torch.tensor([True, False])
    for _ in range(2):  # the second round reads the tensors made by the first
        assert torch.equal(torch.signbit(xp.where(cond, -0.0, 1.0)), torch.tensor([True, False]))
        assert torch.equal(torch.signbit(xp.where(cond, 0.0, 1.0)), torch.tensor([False, False]))
        assert torch.isnan(xp.where(cond, math.nan, 1.0)[0]) and xp.where(cond, math.nan, 1.0)[1] == 1.0
        assert xp.where(cond, 2, 1.0).dtype == torch.float64
        ints = torch.tensor([-3, 5])
        assert xp.maximum(ints, 0).dtype == torch.int64 and torch.equal(xp.maximum(ints, 0), torch.tensor([0, 5]))
        assert torch.equal(xp.minimum(0.5, torch.tensor([0.25, 1.0])), torch.tensor([0.25, 0.5], dtype=torch.float32))
        assert torch.equal(xp.maximum(-0.0, torch.tensor([-1.0], dtype=torch.float64)).signbit(), torch.tensor([True]))


def test_arrays_are_made_tensors_per_call_not_cached():
    from bandcore.kernels.ops import torch_ops

    xp = torch_ops()
    cond = torch.tensor([True, False])
    for values in (np.array([2.0, 3.0]), np.array([4.0, 5.0])):
        got = xp.where(cond, values, 1.0)
        assert torch.equal(got, torch.tensor([values[0], 1.0], dtype=torch.float64))
        assert torch.equal(xp.maximum(torch.zeros(2, dtype=torch.float64), values), torch.from_numpy(values))

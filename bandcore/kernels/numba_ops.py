"""The :mod:`.ops` names for scalars inside Numba-compiled code (libm calls; ``where`` is a select)."""

from __future__ import annotations

import math

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

inf = math.inf
nan = math.nan
exp = math.exp
log = math.log
log1p = math.log1p
expm1 = math.expm1
sqrt = math.sqrt
isfinite = math.isfinite
isnan = math.isnan
_JIT = dict(cache=True, forceinline=True, error_model="numpy")


@njit(**_JIT)
def abs(x):  # the ops name shadows the builtin on purpose
    return math.fabs(x)


@njit(**_JIT)
def where(cond, a, b):
    return a if cond else b


@njit(**_JIT)
def minimum(a, b):
    return a if a < b or math.isnan(a) else b


@njit(**_JIT)
def maximum(a, b):
    return a if a > b or math.isnan(a) else b


@njit(**_JIT)
def logaddexp(a, b):
    m = a if a > b else b
    if m == -math.inf:
        return -math.inf
    return m + math.log1p(math.exp(-math.fabs(a - b)))


@njit(**_JIT)
def exp_ratio(x, c):
    """exp(x) / c, also where exp(x) overflows and the quotient does not (as :func:`.ops.numpy_ops`'s)."""
    return math.exp(x) / c if x < 709.0 else math.exp(x - 709.0) * (math.exp(709.0) / c)


@njit(**_JIT)
def logical_and(a, b):
    return a and b


@njit(**_JIT)
def logical_or(a, b):
    return a or b


@njit(**_JIT)
def logical_not(a):
    return not a


@njit(**_JIT)
def all_true(a):
    return a


@njit(**_JIT)
def take(a, i):
    return a[i]


@njit(**_JIT)
def take_column(a, i, k):
    return a[i, k]


@njit(**_JIT)
def floor_int(x):
    return math.floor(x)  # an int64 in Numba


@intrinsic
def float_bits(typingctx, x):
    """The bits of a float64 as an int64 (a bitcast, no memory round trip)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def bits_float(typingctx, x):
    """The float64 with the bits of an int64."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen

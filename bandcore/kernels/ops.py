r"""The element-wise operations the solvers are written in, for each backend (a tiny array-API shim).

The source modules :mod:`.solvers` and :mod:`.lookup` are written once against a namespace ``xp`` with these
names, and bound (:mod:`.sources`) to one of:

* :data:`numpy_ops` — NumPy arrays (the reference backend);
* :func:`torch_ops` — torch tensors on any device (float64; Python numbers are lifted, so a constant side
  function never meets ``torch.exp`` on a float);
* :mod:`.numba_ops` / :mod:`.numba_fast_ops` — scalars inside Numba-compiled code (``where`` is a select);
* :func:`jax_ops` — ``jax.numpy`` arrays, traceable by ``jax.jit`` (``all_true`` is always False: no early exits;
  ``float_bits`` needs ``jax_enable_x64``); the JAX table reader (:mod:`bandcore.tables.jax_reader`) binds
  :mod:`.lookup` to it.

Names: ``exp log log1p log1p_phi expm1 expm1_phi exp_ratio sqrt abs where minimum maximum logaddexp isfinite isnan
logical_and logical_or logical_not all_true floor_int float_bits take take_column inf nan`` (``float_bits``: a float64's
bits as an int64; ``take(a, i)`` is ``a[i]`` and ``take_column(a, i, k)`` is ``a[i, k]``, gathers by an index array,
which torch runs as ``index_select``, about 3x faster on the CPU than its advanced indexing) and, for generated
generator functions, the hyperbolic functions ``sinh cosh tanh asinh acosh atanh``.
``exp_ratio(x, c)`` is exp(x)/c, also where exp(x) overflows and the quotient does not (c a positive float);
``log1p_phi(x, u)`` is (log1p(x), x - log1p(x)) for u = fl(1 + x) and ``expm1_phi(x)`` (expm1(x), expm1(x) - x), both
without cancellation (the solvers; not in the JAX namespace, which reads tables only).
``muladd(c, a, b, sign=1.0)`` (torch only) is c + sign·a·b in one operation: the torch binding of the sources
has each ``c + a*b``, ``a*b + c``, ``c - a*b`` and ``a*b - k`` (k a number) rewritten to it
(:func:`.sources.fuse_multiply_adds`), so that a Horner polynomial costs one operation a degree, not two.
``integer_power(a, n)`` (NumPy, torch) is a**n for an integer 3 <= n <= 32 by repeated squaring: both bindings have
each such power of the sources rewritten to it (:func:`.sources.integer_powers`), as a general ``pow`` costs
17 (NumPy) to 27 (torch) multiplications (32k float64 values, one thread: x**7 89 and 181 µs, a product 5.3
and 6.6 µs); torch keeps its own a**3, which it computes as products.
``all_true(mask)`` lets a loop stop early where that costs no host synchronisation (NumPy, Numba, torch on the
CPU); on an accelerator or while compiling it is False, so loops run their full, proven length.  ``any_true(mask)``
(NumPy, torch) lets a select skip a branch no element takes, by the same rule: where a check would cost a
synchronisation it is True, so the branch is computed.
"""

from __future__ import annotations

import math
from functools import lru_cache
from types import SimpleNamespace

import numpy as np

__all__ = ["jax_ops", "numpy_ops", "torch_ops"]


def _integer_power(a, n: int):
    """a**n for an integer n >= 1 by repeated squaring (floor(log2 n) squarings, popcount(n) - 1 products: a
    relative error below n ulp, like the compiled backends' expansion of an integer power)."""
    result, square = None, a
    while True:
        if n & 1:
            result = square if result is None else result * square
        n >>= 1
        if not n:
            return result
        square = square * square


def _numpy_all(mask: np.ndarray) -> bool:
    return bool(np.all(mask))


def _numpy_any(mask: np.ndarray) -> bool:
    return bool(np.any(mask))


def _exp_ratio(x, c: float):
    """exp(x) / c as e^(x - s) (e^s / c) with one exp: s = 0, or s = 709 from x = 709 on (where exp(x) may
    overflow and the quotient not; x - 709 is exact there, Sterbenz): within 2 ulp."""
    big = x >= 709.0
    y = np.exp(np.where(big, x - 709.0, x))
    return np.where(big, y * (math.exp(709.0) / c), y / c)


def _log1p_phi(ns: SimpleNamespace):
    """``log1p_phi(x, u)`` on namespace ``ns``: (log1p(x), phi(x) = x - log1p(x)) for u = fl(1 + x), both
    without cancellation (or (log u, u - 1 - log u) for any u > 0 and x = u - 1).  log(u) is compensated for the
    rounding of u; for x in (-0.29, 0.41) (as Numba's: |t| < 0.18), with t = x/(2 + x), log1p(x) = 2t + 2ty(t^2),
    y(z) = sum_k z^k/(2k+1), and x - 2t = xt, so phi = xt - 2ty; elsewhere x - log1p(x) (cancelling <= ~8x)."""

    def log1p_phi(x, u):
        regular = ns.logical_and(u > 0.0, u < math.inf)
        correction = ns.where(regular, (x - (u - 1.0)) / u, 0.0)
        lg = ns.log(u) + correction
        t = x / (2.0 + x)
        z = t * t
        y = 0.0
        for k in range(11, 0, -1):  # sum_{k<=11} z^k/(2k+1): its error is below 1e-17 relative for |t| < 0.18
            y = (y + 1.0 / (2 * k + 1)) * z
        phi_near = x * t - 2.0 * t * y
        return lg, ns.where(ns.logical_and(x > -0.29, x < 0.41), phi_near, x - lg)

    return log1p_phi


#: 1/k! for k = 16 down to 2: e^x - 1 - x = x^2 sum_{k>=2} x^(k-2)/k!, truncated after x^16 (relative error below
#: 1e-17 for |x| < 0.35)
_EXP_TAIL = tuple(1.0 / math.factorial(k) for k in range(16, 1, -1))


def _expm1_phi(ns: SimpleNamespace):
    """``expm1_phi(x)`` on namespace ``ns``: (e^x - 1, e^x - 1 - x), the second from its Taylor series for
    |x| < 0.35 (as Numba's: where its reduction leaves r = x), elsewhere (e^x - 1) - x (cancelling <= ~6x)."""

    def expm1_phi(x):
        em = ns.expm1(x)
        near = ns.abs(x) < 0.35
        z = ns.where(near, x, 0.0)  # the series on |x| < 0.35 only (no overflow, no inf * 0 beyond)
        tail = z * 0.0
        for c in _EXP_TAIL:
            tail = tail * z + c
        return em, ns.where(near, tail * (z * z), em - x)

    return expm1_phi


numpy_ops = SimpleNamespace(
    exp=np.exp,
    log=np.log,
    log1p=np.log1p,
    expm1=np.expm1,
    exp_ratio=_exp_ratio,
    integer_power=_integer_power,
    sqrt=np.sqrt,
    abs=np.abs,
    where=np.where,
    minimum=np.minimum,
    maximum=np.maximum,
    logaddexp=np.logaddexp,
    isfinite=np.isfinite,
    isnan=np.isnan,
    logical_and=np.logical_and,
    logical_or=np.logical_or,
    logical_not=np.logical_not,
    all_true=_numpy_all,
    any_true=_numpy_any,
    floor_int=lambda x: np.floor(x).astype(np.int64),
    float_bits=lambda x: np.asarray(x, dtype=np.float64).view(np.int64),
    take=lambda a, i: a[i],
    take_column=lambda a, i, k: a[i, k],
    sinh=np.sinh,
    cosh=np.cosh,
    tanh=np.tanh,
    asinh=np.arcsinh,
    acosh=np.arccosh,
    atanh=np.arctanh,
    inf=math.inf,
    nan=math.nan,
    name="numpy",
)
numpy_ops.log1p_phi = _log1p_phi(numpy_ops)
numpy_ops.expm1_phi = _expm1_phi(numpy_ops)


def _is_number(x) -> bool:
    """A Python number other than a bool (what ``muladd`` passes to torch as a scalar)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _logaddexp(a: float, b: float) -> float:
    top = max(a, b)
    return top if top == -math.inf else top + math.log1p(math.exp(-abs(a - b)))


@lru_cache(maxsize=1)
def torch_ops() -> SimpleNamespace:
    """The namespace for torch tensors (imports torch on first use)."""
    import torch

    def lift(fn, scalar_fn):
        def op(x):
            return fn(x) if isinstance(x, torch.Tensor) else scalar_fn(x)

        return op

    constants: dict[tuple, torch.Tensor] = {}

    def constant(c, dtype: torch.dtype, on: torch.Tensor) -> torch.Tensor:
        """``c`` as a 0-d tensor of ``dtype`` on ``on``'s device, made once per value (sign of zero included) and
        dtype (a new one per call would cost operations, on an accelerator a copy to it); made anew for anything
        but a Python number, for NaN and while compiling."""
        if not isinstance(c, (int, float)) or c != c or torch.compiler.is_compiling():
            return torch.as_tensor(c, dtype=dtype, device=on.device)
        key = (c, math.copysign(1.0, c), dtype, None if on.is_cpu else on.device)
        value = constants.get(key)
        if value is None:
            value = constants[key] = torch.as_tensor(c, dtype=dtype, device=on.device)
        return value

    def where(cond, a, b):
        if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
            a = constant(a, torch.float64, cond)
        return torch.where(cond, a, b)

    def exp_ratio(x, c: float):
        big = x >= 709.0  # as the NumPy one: one exp (scalars as wrapped numbers: no copy to the device)
        y = torch.exp(torch.where(big, x - 709.0, x))
        return torch.where(big, y * (math.exp(709.0) / c), y / c)

    def all_true(mask) -> bool:
        """On the CPU a check costs no synchronisation; elsewhere, or while compiling, loops run their length."""
        if mask.device.type != "cpu" or torch.compiler.is_compiling():
            return False
        return bool(mask.all())

    def any_true(mask) -> bool:
        """On the CPU a check costs no synchronisation; elsewhere, or while compiling, True (the branch is computed)."""
        if not isinstance(mask, torch.Tensor):
            return bool(mask)
        if mask.device.type != "cpu" or torch.compiler.is_compiling():
            return True
        return bool(mask.any())

    def take(a, i):
        if not isinstance(i, torch.Tensor):
            return a[i]
        return a.index_select(0, i) if i.dim() == 1 else a.index_select(0, i.reshape(-1)).reshape(i.shape)

    def take_column(a, i, k: int):
        return take(a.select(1, k), i)

    def muladd(c, a, b, sign: float = 1.0):
        """c + sign·a·b in one operation (``addcmul``, or ``add`` with a number as ``alpha``) where a or b is a
        floating tensor, else as written; while compiling as written (the compiler fuses it)."""
        t, other = (a, b) if isinstance(a, torch.Tensor) else (b, a)
        if isinstance(t, torch.Tensor) and t.is_floating_point() and not torch.compiler.is_compiling():
            other_tensor = isinstance(other, torch.Tensor)
            other_fits = other.dtype == t.dtype if other_tensor else _is_number(other)
            c_fits = c.dtype == t.dtype if isinstance(c, torch.Tensor) else _is_number(c)
            if other_fits and c_fits:
                c = c if isinstance(c, torch.Tensor) else constant(float(c), t.dtype, t)
                return torch.addcmul(c, t, other, value=sign) if other_tensor else torch.add(c, t, alpha=sign * other)
        return c + a * b if sign == 1.0 else c - a * b

    def binary(fn, scalar_fn):
        def op(a, b):
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                a = a if isinstance(a, torch.Tensor) else constant(a, b.dtype, b)
                b = b if isinstance(b, torch.Tensor) else constant(b, a.dtype, a)
                return fn(a, b)
            return scalar_fn(a, b)

        return op

    ops = SimpleNamespace(
        exp=lift(torch.exp, math.exp),
        log=lift(torch.log, lambda x: math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)),
        log1p=lift(torch.log1p, lambda x: math.log1p(x) if x > -1 else (-math.inf if x == -1 else math.nan)),
        expm1=lift(torch.expm1, math.expm1),
        exp_ratio=exp_ratio,
        integer_power=lambda a, n: a**n if n <= 3 else _integer_power(a, n),
        sqrt=lift(torch.sqrt, lambda x: math.sqrt(x) if x >= 0 else math.nan),
        abs=lift(torch.abs, abs),
        where=where,
        minimum=binary(torch.minimum, min),
        maximum=binary(torch.maximum, max),
        logaddexp=binary(torch.logaddexp, _logaddexp),
        isfinite=lift(torch.isfinite, math.isfinite),
        isnan=lift(torch.isnan, math.isnan),
        logical_and=torch.logical_and,
        logical_or=torch.logical_or,
        logical_not=torch.logical_not,
        all_true=all_true,
        any_true=any_true,
        floor_int=lambda x: torch.floor(x).long(),
        float_bits=lambda x: x.view(torch.int64),
        take=take,
        take_column=take_column,
        sinh=lift(torch.sinh, math.sinh),
        cosh=lift(torch.cosh, math.cosh),
        tanh=lift(torch.tanh, math.tanh),
        asinh=lift(torch.asinh, math.asinh),
        acosh=lift(torch.acosh, math.acosh),
        atanh=lift(torch.atanh, math.atanh),
        muladd=muladd,
        inf=math.inf,
        nan=math.nan,
        name="torch",
    )
    ops.log1p_phi = _log1p_phi(ops)
    ops.expm1_phi = _expm1_phi(ops)
    return ops


@lru_cache(maxsize=1)
def jax_ops() -> SimpleNamespace:
    """The namespace for ``jax.numpy`` arrays (imports jax on first use); every function is traceable by
    ``jax.jit``, so loops never stop early (``all_true`` is False)."""
    import jax
    import jax.numpy as jnp

    def exp_ratio(x, c: float):
        big = x >= 709.0  # as the NumPy one
        y = jnp.exp(jnp.where(big, x - 709.0, x))
        return jnp.where(big, y * (math.exp(709.0) / c), y / c)

    return SimpleNamespace(
        exp=jnp.exp,
        log=jnp.log,
        log1p=jnp.log1p,
        expm1=jnp.expm1,
        exp_ratio=exp_ratio,
        sqrt=jnp.sqrt,
        abs=jnp.abs,
        where=jnp.where,
        minimum=jnp.minimum,
        maximum=jnp.maximum,
        logaddexp=jnp.logaddexp,
        isfinite=jnp.isfinite,
        isnan=jnp.isnan,
        logical_and=jnp.logical_and,
        logical_or=jnp.logical_or,
        logical_not=jnp.logical_not,
        all_true=lambda mask: False,
        floor_int=lambda x: jnp.floor(x).astype(jnp.int64),
        float_bits=lambda x: jax.lax.bitcast_convert_type(jnp.asarray(x, dtype=jnp.float64), jnp.int64),
        take=lambda a, i: a[i],
        take_column=lambda a, i, k: a[i, k],
        sinh=jnp.sinh,
        cosh=jnp.cosh,
        tanh=jnp.tanh,
        asinh=jnp.arcsinh,
        acosh=jnp.arccosh,
        atanh=jnp.arctanh,
        inf=math.inf,
        nan=math.nan,
        name="jax",
    )

r"""Double-word arithmetic in JAX (a number as an unevaluated sum hi + lo of two floats of the working dtype), for
the threshold series of :mod:`bandcore.tables.jax_series`: about 106 bits in float64, 48 in float32.

Products are exact by splitting each factor's mantissa with a bit mask (:func:`split`), not by Dekker's
multiplication by :math:`2^{s}+1`: a bit operation cannot be fused or reassociated by the compiler.  With
every partial product exact, a fused multiply-add (which XLA forms on GPUs) changes nothing either.  The
coefficients must reach the arithmetic through ``jax.lax.optimization_barrier``
(:func:`bandcore.tables.jax_reader.opaque`): XLA's simplifier reassociates sums with constants.
"""

from __future__ import annotations

import numpy as np

__all__ = ["clenshaw", "dd_add", "dd_mul", "split", "two_prod", "two_sum"]

#: low mantissa bits cleared by :func:`split` (the high part keeps 26 of float64's 53 bits, 12 of float32's 24)
_LOW_BITS = {np.dtype(np.float64): (27, np.int64), np.dtype(np.float32): (12, np.int32)}


def two_sum(a, b):
    """(s, e) with s = fl(a + b) and s + e = a + b exactly (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def split(a):
    """(hi, lo) with hi = a with its low mantissa bits cleared and lo = a - hi (exact): products of the parts are
    exact (but for lo·lo, off by at most 2^-106 |a·b| in float64)."""
    import jax

    bits, itype = _LOW_BITS[np.dtype(a.dtype)]
    hi = jax.lax.bitcast_convert_type(jax.lax.bitcast_convert_type(a, itype) & ~((1 << bits) - 1), a.dtype)
    return hi, a - hi


def two_prod(a, b):
    """(p, e) with p = fl(a b) and p + e = a b to twice the working precision."""
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def dd_add(x, y):
    """x + y of two double-words (each a pair), to double-word precision."""
    s, e = two_sum(x[0], y[0])
    t, f = two_sum(x[1], y[1])
    e = e + t
    s, e = two_sum(s, e)
    return two_sum(s, e + f)


def dd_mul(x, b):
    """x · b of a double-word x and a float b."""
    p, e = two_prod(x[0], b)
    return two_sum(p, e + x[1] * b)


def clenshaw(t, hi, lo):
    r""":math:`\sum_j c_j T_j(t)` in double-word arithmetic for a float t (exact) and coefficients c_j = hi[..., j] +
    lo[..., j] (the last axis; leading axes broadcast against t): Clenshaw's recurrence
    :math:`b_j = c_j + 2t\,b_{j+1} - b_{j+2}`, then :math:`c_0 + t\,b_1 - b_2`.  Returns (hi, lo)."""
    import jax
    import jax.numpy as jnp

    n = hi.shape[-1]
    zero = jnp.zeros_like(t)
    two_t = t + t

    def step(i, carry):
        j = n - 1 - i
        b1, b2 = carry
        c = (jnp.take(hi, j, axis=-1), jnp.take(lo, j, axis=-1))
        b = dd_add(dd_add(c, dd_mul(b1, two_t)), (-b2[0], -b2[1]))
        return b, b1

    b1, b2 = jax.lax.fori_loop(0, n - 1, step, ((zero, zero), (zero, zero)))
    c0 = (hi[..., 0] + zero, lo[..., 0] + zero)
    return dd_add(dd_add(c0, dd_mul(b1, t)), (-b2[0], -b2[1]))

"""The :mod:`.numba_ops` names with exp, expm1, expm1_phi, exp_ratio, log, log1p and log1p_phi written out (range
reduction + polynomial fits of e^r and atanh, <= 2 ulp, every branch a select) so that LLVM vectorises a loop over
them; libm calls would not vectorise and cost 4-5x more.  Every generated solver module of the Numba backend uses
them."""

from __future__ import annotations

import math

from numba import njit

from .numba_ops import (  # noqa: F401 - re-exported ops names
    abs,
    all_true,
    bits_float,
    float_bits,
    inf,
    isfinite,
    isnan,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    nan,
    sqrt,
    take,
    take_column,
    where,
)
from .numba_ops import bits_float as _as_float
from .numba_ops import float_bits as _as_int

_JIT = dict(cache=True, forceinline=True, error_model="numpy", fastmath={"nsz", "arcp", "contract"})
LN2_HI = 6.93147180369123816490e-01  # ln 2 = LN2_HI + LN2_LO, LN2_HI with 32 trailing zero bits
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.4426950408889634
SQRT_HALF_BITS = 0x3FE6A09E667F3BCD
TWO_52 = 4503599627370496.0
TWO_52_BITS = 0x4330000000000000
MIN_NORMAL = 2.2250738585072014e-308
#: 1.5 * 2^52: x + ROUND rounds x (|x| < 2^51) to an integer and holds it, two's complement, in its low bits
ROUND = 6755399441055744.0
EXPONENT_ONE = 1023 << 52


@njit(**_JIT)
def _round(x):
    """x rounded to the nearest integer (ties to even), as a float: (x + ROUND) - ROUND.  Integers stay floats
    throughout the fast ops: float <-> int64 conversions have no AVX2 instruction (only AVX-512), so LLVM
    would convert lane by lane."""
    return (x + ROUND) - ROUND


@njit(**_JIT)
def low_bits_float(v):
    """The float of an integer v in [0, 2^52) without an int64 -> float64 conversion: v's bits OR-ed into those of
    2^52 make 2^52 + v exactly, and 2^52 is taken off again."""
    return _as_float(v | TWO_52_BITS) - TWO_52


@njit(**_JIT)
def _pow2(n):
    """2^n for an integer-valued float n in [-1022, 1023]: n's bits, read off n + ROUND, shifted into the
    exponent (the bits of ROUND shift out)."""
    return _as_float((_as_int(n + ROUND) << 52) + EXPONENT_ONE)


#: e^r - 1 - r - r^2/2 = r^3 Q(r) on |r| <= ln2/2: Q's Chebyshev fit (mpmath.chebyfit, 10 terms, highest first);
#: max |error of Q| 8.1e-18, so e^r - 1 errs by < 3.4e-19 where Taylor needed degree 13 for 4e-18
EXPM1_Q = (2.0911229729827565e-09, 2.510037583265786e-08, 2.755728298405573e-07, 2.755726848030982e-06,
           2.4801587317135164e-05, 0.00019841269863040545, 0.0013888888888886554, 0.008333333333330065,
           0.041666666666666664, 0.16666666666666669)
#: atanh(s)/s - 1 = z P(z), z = s^2 <= ((sqrt 2 - 1)/(sqrt 2 + 1))^2: P's Chebyshev fit (mpmath.chebyfit, 7 terms,
#: highest first); max |error of P| 1.6e-16, so log errs by < 5e-18 relative where the series needed 11 terms
ATANH_P = (0.07308224843200398, 0.07665860800223112, 0.09091444562632513, 0.11111105567397517,
           0.14285714312987743, 0.19999999999949752, 0.3333333333333335)


@njit(**_JIT)
def _expm1_q(x):
    """Q(x) of :data:`EXPM1_Q` for |x| <= ln2/2, Horner written out (a loop over the coefficients would not
    vectorise)."""
    c = EXPM1_Q
    q = c[0] * x + c[1]
    q = q * x + c[2]
    q = q * x + c[3]
    q = q * x + c[4]
    q = q * x + c[5]
    q = q * x + c[6]
    q = q * x + c[7]
    q = q * x + c[8]
    return q * x + c[9]


@njit(**_JIT)
def _expm1_poly(x):
    """e^x - 1 = x + x^2/2 + x^3 Q(x) for |x| <= ln2/2 (:data:`EXPM1_Q`)."""
    return ((_expm1_q(x) * x + 0.5) * x + 1.0) * x


@njit(**_JIT)
def _reduce(x):
    """(n, r, xc): x clamped to [-746, 1000] as xc = n ln2 + r, |r| <= ln2/2 (ln2 in two parts: r is exact); n an
    integer-valued float."""
    xc = min(max(x, -746.0), 1000.0)
    n = _round(xc * INV_LN2)
    return n, (xc - n * LN2_HI) - n * LN2_LO, xc


@njit(**_JIT)
def _scaled(y, k):
    """y 2^k for an integer-valued float k in [-1076, 1443] (x clamped in :func:`_reduce`), in two factors
    (subnormals)."""
    h = _round(0.5 * k)
    return y * _pow2(h) * _pow2(k - h)


@njit(**_JIT)
def exp(x):
    """exp(x) = 2^n e^r, e^r from :func:`_expm1_poly` (error < 3.4e-19), times 2^n in two factors (subnormals)."""
    n, r, _ = _reduce(x)
    y = _scaled(_expm1_poly(r) + 1.0, n)
    return y if x >= -746.0 else (0.0 if x < -746.0 else x)  # exp(-inf) = 0, NaN stays NaN


@njit(**_JIT)
def expm1(x):
    """exp(x) - 1 from one reduction x = n ln2 + r and one polynomial t = e^r - 1: for |n| <= 53,
    2^n t + (2^n - 1) (each term exact up to one rounding, where exp(x) - 1 would lose two bits; for
    |x| < ln2/2, n = 0 and r = x, so it is t itself, without cancellation); beyond, 2^n (t + 1) - 1, i.e.
    exp(x) - 1 (-1 or exp(x) up to rounding; also inf).  -1 below -746; NaN stays NaN."""
    n, r, _ = _reduce(x)
    t = _expm1_poly(r)
    scale = _pow2(min(max(n, -60.0), 60.0))
    mid = scale * t + (scale - 1.0)
    value = mid if math.fabs(n) <= 53.0 else _scaled(t + 1.0, n) - 1.0
    return value if x >= -746.0 else (-1.0 if x < -746.0 else x)


@njit(**_JIT)
def expm1_phi(x):
    """(e^x - 1, e^x - 1 - x), the second without cancellation: where the reduction leaves r = x (n = 0, |x| <=
    ln2/2) it is x^2 (1/2 + x Q(x)), :func:`expm1`'s polynomial without its linear term (the same Q, which LLVM
    computes once for both); elsewhere (e^x - 1) - x, which cancels at most ~6x there (|x| > 0.34)."""
    n, r, _ = _reduce(x)
    em = expm1(x)
    tail = (_expm1_q(r) * r + 0.5) * (r * r)
    return em, (tail if n == 0.0 else em - x)


@njit(**_JIT)
def exp_ratio(x, c):
    """exp(x) / c for c in [1e-300, 1e300], without overflowing where exp(x) does and the quotient does not: the
    division comes before the scaling by 2^n.  From the reduction and polynomial of :func:`exp` at the same x, so
    LLVM computes them once for both where a caller also takes exp(x) or expm1(x)."""
    n, r, _ = _reduce(x)
    y = _scaled((_expm1_poly(r) + 1.0) / c, n)
    return y if x >= -746.0 else (0.0 if x < -746.0 else x)


@njit(**_JIT)
def _log_parts(x):
    """(log x before its special cases, s, z-series y, whether x's exponent is 0, ~1/x within 0.51 %): x = 2^e m, m in
    [sqrt(1/2), sqrt(2)), s = (m-1)/(m+1), |s| < 0.172, log x = e ln2 + 2s + 2sy with y = sum_{k>=1} s^2k/(2k+1).
    The rough 1/x serves the compensation of a rounding (a term below 1 ulp), for which 0.51 % is exact enough."""
    tiny = x < MIN_NORMAL
    bits = _as_int(x * TWO_52 if tiny else x)  # subnormal: scale into the normal range
    e = (bits - SQRT_HALF_BITS) >> 52
    m = _as_float(bits - (e << 52))
    s = (m - 1.0) / (m + 1.0)  # m - 1 exact (Sterbenz)
    z = s * s
    c = ATANH_P
    y = c[0] * z + c[1]
    y = y * z + c[2]
    y = y * z + c[3]
    y = y * z + c[4]
    y = y * z + c[5]
    y = (y * z + c[6]) * z  # sum_{k>=1} z^k / (2k+1) (:data:`ATANH_P`)
    fe = float(e) - (52.0 if tiny else 0.0)
    # ~1/x without a division: 2^-e (1 - s)/(1 + s), 1/(1 + s) as 1 - s + s^2 (within s^3 < 0.51 %); 0 for a
    # subnormal x and for e = 1023 (2^-1023 is not a normal number)
    rough_reciprocal = (0.0 if tiny else _as_float((1023 - e) << 52)) * ((1.0 - s) * (1.0 - s + s * s))
    return fe * LN2_HI + (2.0 * s * y + fe * LN2_LO + 2.0 * s), s, y, e == 0 and not tiny, rough_reciprocal


@njit(**_JIT)
def log(x):
    """log(x) = e ln2 + 2 atanh(s), x = 2^e m, m in [sqrt(1/2), sqrt(2)), s = (m-1)/(m+1), |s| < 0.172."""
    value = _log_parts(x)[0]
    if x > 0.0 and x < math.inf:
        return value
    return -math.inf if x == 0.0 else (x if x > 0.0 else math.nan)


@njit(**_JIT)
def log1p(x):
    """log(1 + x) = log(u) + (x - (u - 1))/u with u = fl(1 + x): the rounding of u compensated (1/u rough, from
    :func:`_log_parts`: the correction is below 1 ulp, so 0.51 % of it is far below rounding)."""
    u = 1.0 + x
    value, _, _, _, rough_reciprocal = _log_parts(u)
    if u > 0.0 and u < math.inf:
        return value + (x - (u - 1.0)) * rough_reciprocal
    return -math.inf if u == 0.0 else (u if u > 0.0 else math.nan)  # log1p(-1) = -inf, log1p(inf) = inf


@njit(**_JIT)
def log1p_phi(x, u):
    """(log1p(x), phi(x) = x - log1p(x)) for u = fl(1 + x), each without cancellation: log(u) compensated for the
    rounding of u, and where u's exponent is 0 (u in [sqrt(1/2), sqrt(2))) phi from log's own series: with
    x_u = u - 1 (exact) and s = x_u/(2 + x_u), log u = 2s + 2sy and x_u - 2s = x_u s, so phi(x_u) = x_u s - 2sy,
    and phi(x) follows by Taylor in the rounding x - x_u, with no series of its own; elsewhere x - log1p(x)
    (which cancels at most ~8x there).  Any u > 0 with x = u - 1 gives (log u, u - 1 - log u)."""
    value, s, y, near, rough_reciprocal = _log_parts(u)
    regular = u > 0.0 and u < math.inf
    correction = (x - (u - 1.0)) * rough_reciprocal if regular else 0.0  # below 1 ulp: a rough 1/u is enough
    if regular:
        lg = value + correction
    else:
        lg = -math.inf if u == 0.0 else (u if u > 0.0 else math.nan)
    x_u = u - 1.0
    rounding = x - x_u  # exact; phi(x) = phi(x_u) + rounding x_u/u + rounding^2/2 (u's rounding is below 1e-16)
    phi_near = x_u * s - 2.0 * s * y + (correction * x_u + 0.5 * rounding * rounding)
    return lg, (phi_near if near else x - lg)


@njit(**_JIT)
def logaddexp(a, b):
    """log(e^a + e^b) = max + log1p(e^-|a - b|); exact at infinite ends (a - b would be NaN there)."""
    m = a if a > b else b
    value = m + log1p(exp(-math.fabs(a - b)))
    return m if math.isinf(m) else value

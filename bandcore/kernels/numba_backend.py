r"""Numba backend: the solver of :mod:`.numpy_backend`, compiled per divergence, parallel over tokens.

For each divergence a small Python module is generated — the divergence's four functions (from
:mod:`.generic`, ``math`` module code) followed by :data:`SOLVER_SOURCE` — written once to the cache directory
(``$BANDCORE_CACHE`` or ``~/.cache/bandcore``, file named by a hash of the code) and imported, so that
``numba.njit(cache=True)`` can cache the machine code on disk (the first call of a new divergence compiles
for ~10 s; later processes load it).  The scalar solver is the same safeguarded Newton as the NumPy reference
(same formulas, same start, same stopping rule), run per token inside ``prange``; both roots of a token share
:math:`\log(1-p)`.  Memory: the two outputs only.

Entry point: :func:`band_log` ``(divergence, old_log_prob_fp64, delta) -> (log_lower, log_upper)`` with the
kernel conventions of :func:`.numpy_backend.band_log`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import numpy as np

from ..divergences import Divergence
from .generic import generator_functions
from .numpy_backend import D_MAX, LOG_P_TINY, MAX_ITERATIONS, Q_NEAR_ONE, STEP_TOLERANCE, p_one_lower

__all__ = ["SOLVER_SOURCE", "band_log", "cache_dir", "compiled_module"]

#: LLVM fast-math flags that keep NaN/inf semantics (full fastmath breaks isnan and inf comparisons).
FASTMATH = {"nsz", "arcp", "contract"}

SOLVER_SOURCE = '''
@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def cells(lp, lq, p, pc, d):
    """(x_r, log r, r, x_s, log s, s, q) at offset d, as in numpy_backend._cells."""
    den = p + math.exp(-d) / -math.expm1(-d)  # (1 + pE)/E, no overflow
    x_r = pc / den  # r - 1 = (1-p)E/(1+pE)
    x_s = -p / den  # s - 1 = -pE/(1+pE)
    b = lp + d
    a = max(lq, b) + math.log1p(math.exp(-abs(lq - b)))  # log(1 + pE) = logaddexp(log(1-p), log p + d)
    if lp < LOG_P_TINY and b > -40.0:  # p subnormal: from logs
        if b > lq:  # log r = d - a, without forming lp + d - lp when d >> |lp|
            log_r = -lp - math.log1p(math.exp(lq - b))
        else:
            log_r = d - lq - math.log1p(math.exp(b - lq))
        x_r = math.expm1(log_r)
        x_s = math.expm1(-a)
    else:
        log_r = math.log1p(x_r)
    if x_s < -0.5:
        log_s = -a
        s = math.exp(log_s)
    else:
        log_s = math.log1p(x_s)
        s = 1.0 + x_s
    r = 1.0 + x_r
    if lp < LOG_P_TINY:
        q = math.exp(lp + log_r)
    else:
        q = p * r  # q = p r
    return x_r, log_r, r, x_s, log_s, s, q


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def g_and_slope(lp, lq, p, pc, d):
    x_r, log_r, r, x_s, log_s, s, q = cells(lp, lq, p, pc, d)
    g = q * phi_r(x_r, log_r, r) + pc * f_s(x_s, log_s, s)  # p f(r) = q f(r)/r
    slope = q * (pc * s * dphi_r(x_r, log_r, r) - pc * k_s(x_s, log_s, s))  # 1 - q = (1-p) s
    return g, slope


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def saturated(lp, pc, delta):
    """G(inf) = Phi(1/p) + (1-p) f(0) <= delta: the upper ratio is 1/p."""
    if lp >= LOG_P_TINY:
        x = math.expm1(-lp)
        phi = phi_r(x, -lp, 1.0 + x)
    else:
        phi = SLOPE_AT_INFINITY
    if F_AT_ZERO == math.inf:
        rest = math.inf if pc > 0 else 0.0
    else:
        rest = pc * F_AT_ZERO
    return phi + rest <= delta


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def start(p, pc, lp, lq, delta):
    """Small-delta root of G ~ p(1-p)(kink d + f''(1) d^2/2), capped at logit q = Q_NEAR_ONE."""
    c = p * pc
    if F2 > 0:
        d = (math.sqrt(KINK * KINK + 2.0 * F2 * delta / c) - KINK) / F2
    elif KINK > 0:
        d = delta / (KINK * c)
    else:
        d = 1.0
    cap = max(Q_NEAR_ONE + lq - lp, Q_NEAR_ONE)
    if d > 0 and d < cap:
        return d
    return cap


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def pick(g, slope, d, lo, hi, d_prev, g_prev, delta):
    """The Newton variant whose local model best predicts the previous point (numpy_backend._step)."""
    rate = slope / g  # d log G / dd
    log_ratio = math.log(delta / g)
    log_seen = math.log(g_prev / g)
    error_linear = abs(math.log1p(rate * (d_prev - d)) - log_seen)
    error_exponential = abs(rate * (d_prev - d) - log_seen)
    error_power = abs(rate * d * math.log(d_prev / d) - log_seen)
    if math.isnan(error_linear):
        error_linear = math.inf
    if math.isnan(error_exponential):
        error_exponential = math.inf
    if math.isnan(error_power) or error_power <= min(error_linear, error_exponential):
        return d * math.exp(log_ratio / (rate * d))  # Newton on log G vs log d
    if error_linear < error_exponential:
        return d + (delta - g) / slope  # Newton on G
    return d + log_ratio / rate  # Newton on log G


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def solve(lp, lq, delta):
    """Root d of G(d) = delta (inf when saturated): the safeguarded Newton of numpy_backend._step."""
    p = math.exp(lp)
    pc = math.exp(lq)
    if saturated(lp, pc, delta):
        return math.inf
    d = start(p, pc, lp, lq, delta)
    lo = 0.0
    hi = D_MAX
    d_prev = math.nan
    g_prev = math.nan
    for _ in range(MAX_ITERATIONS):
        g, slope = g_and_slope(lp, lq, p, pc, d)
        if g <= delta:
            lo = max(lo, d)
        else:
            hi = min(hi, d)
        candidate = pick(g, slope, d, lo, hi, d_prev, g_prev, delta)
        # a step from an overflowed G or slope (inf) says nothing about convergence
        if abs(candidate - d) <= STEP_TOLERANCE * d and math.isfinite(g) and math.isfinite(slope):
            return candidate
        shrinking = hi >= D_MAX or not abs(candidate - d) > 0.5 * abs(d - d_prev)
        if not (candidate > lo and candidate < hi and shrinking):
            floor = lo if lo > 0 else min(1.0, 0.125 * hi)  # d ~ 1: natural scale of a logit
            if hi > 4.0 * floor:
                candidate = math.sqrt(floor) * math.sqrt(hi)
            else:
                candidate = 0.5 * (lo + hi)
        if hi - lo <= 4e-16 * hi:
            return candidate
        d_prev = d
        g_prev = g
        d = candidate
    return d


@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def log_ratios(lp, lq, d):
    x_r, log_r, r, x_s, log_s, s, q = cells(lp, lq, math.exp(lp), math.exp(lq), d)
    return log_r, log_s


@njit(cache=True, parallel=True, fastmath=FASTMATH, error_model="numpy")
def band_log_kernel(old_log_prob, delta, lower_at_one, lower, upper):
    for i in prange(old_log_prob.size):
        lp = old_log_prob[i]
        if lp < 0 and lp > -math.inf:
            lq = math.log(-math.expm1(lp))  # log(1-p), exact near p = 1
            # saturated: r = 1/p exactly; for 1 - p < e^-700, 1/p - r_up < 1e-300 s (f(s) ~ delta/(1-p))
            d = solve(lp, lq, delta) if lq >= LOG_P_TINY else math.inf
            upper[i] = -lp if d == math.inf else min(log_ratios(lp, lq, d)[0], -lp)  # r_up <= 1/p
            d = solve(lq, lp, delta)  # mirror: p <-> 1-p
            lower[i] = -math.inf if d == math.inf else log_ratios(lq, lp, d)[1]
        elif lp == 0:
            lower[i] = lower_at_one
            upper[i] = 0.0
        elif lp == -math.inf:
            lower[i] = -math.inf
            upper[i] = math.inf
        else:
            lower[i] = math.nan
            upper[i] = math.nan
'''

_HEADER = '''"""Generated by bandcore.kernels.numba_backend for the divergence {name!r}; do not edit."""
import math

from numba import njit, prange

FASTMATH = set({fastmath!r})
LOG_P_TINY = {log_p_tiny!r}
D_MAX = {d_max!r}
Q_NEAR_ONE = {q_near_one!r}
MAX_ITERATIONS = {max_iterations!r}
STEP_TOLERANCE = {step_tolerance!r}
F_AT_ZERO = {f_at_zero}
SLOPE_AT_INFINITY = {slope}
F2 = {f2!r}
KINK = {kink!r}

'''


def cache_dir() -> Path:
    """Where generated kernel modules (and Numba's cache of them) live."""
    root = os.environ.get("BANDCORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "bandcore"
    )
    return Path(root) / "numba"


def _float_source(value: float) -> str:
    return "math.inf" if value == np.inf else repr(value)


def module_source(divergence: str | Divergence) -> str:
    """The full source of the generated module for ``divergence``."""
    gf = generator_functions(divergence)
    header = _HEADER.format(
        name=gf.divergence.name,
        fastmath=sorted(FASTMATH),
        log_p_tiny=LOG_P_TINY,
        d_max=D_MAX,
        q_near_one=Q_NEAR_ONE,
        max_iterations=MAX_ITERATIONS,
        step_tolerance=STEP_TOLERANCE,
        f_at_zero=_float_source(gf.f_at_zero),
        slope=_float_source(gf.slope_at_infinity),
        f2=gf.f2,
        kink=gf.kink,
    )
    functions = "\n\n".join(
        "@njit(cache=True, fastmath=FASTMATH, error_model='numpy')\n" + fn.math_source() for fn in gf.functions
    )
    return header + functions + "\n" + SOLVER_SOURCE


@lru_cache(maxsize=64)
def compiled_module(divergence: str | Divergence) -> ModuleType:
    """Write (once) and import the generated module of ``divergence``."""
    return import_generated("generic", module_source(divergence))


def import_generated(kind: str, source: str) -> ModuleType:
    """Write ``source`` (once, named by its hash) to :func:`cache_dir` and import it, so Numba can cache it."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"bandcore_numba_{kind}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            handle.write(source)
        os.replace(tmp, path)  # atomic: concurrent writers produce the same file
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def band_log(
    divergence: str | Divergence, old_log_prob: np.ndarray, delta: float
) -> tuple[np.ndarray, np.ndarray]:
    """(log r_lo, log r_up) for a float64 array (kernel conventions of :func:`.numpy_backend.band_log`).

    KL goes to the specialised kernel :func:`.kl.band_log_numba`, TV and Pearson to :mod:`.closed`.
    """
    from . import closed, kl

    if kl.is_kl(divergence):
        return kl.band_log_numba(old_log_prob, delta)
    kind = closed.closed_form_kind(divergence)
    if kind is not None:
        return closed.band_log_numba(kind, old_log_prob, delta)
    module = compiled_module(divergence)
    lp = np.asarray(old_log_prob, dtype=np.float64)
    flat = np.ascontiguousarray(lp.reshape(-1))
    lower = np.empty_like(flat)
    upper = np.empty_like(flat)
    at_one = p_one_lower(generator_functions(divergence).divergence, float(delta)) if np.any(flat == 0) else 0.0
    module.band_log_kernel(flat, float(delta), at_one, lower, upper)
    return lower.reshape(lp.shape), upper.reshape(lp.shape)

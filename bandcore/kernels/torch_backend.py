r"""Torch backend: the solver of :mod:`.numpy_backend` in torch ops, device-agnostic, sync-free.

Same formulas, start and safeguarded Newton steps as the NumPy reference, with two differences that keep
it free of host synchronisation (and traceable by ``torch.compile``): a **fixed** number of iterations
(:data:`ITERATIONS`, every token runs all of them; a converged token is frozen), and no data-dependent Python
branching.  The iteration count is checked by the tests: the NumPy reference needs at most 15 on the contract
grid (log p ∈ [-700, 0), δ ∈ [1e-8, 10], all catalogue divergences), so 24 leaves a margin.

Precision: always float64, on CPU and on CUDA (whatever the input dtype; the result is rounded once to it by
:func:`bandcore.band_log`), so the GPU error is the fp64 error of the contract, ≤ 1e-12 relative in log r.

Entry points: :func:`band_log` ``(divergence, old_log_prob_fp64_tensor, delta)``, :func:`band_log_numpy`
(NumPy in/out through CPU torch), both with the kernel conventions of :func:`.numpy_backend.band_log`, and
:func:`band_log_function` ``(divergence, delta)``: the pure tensor function to hand to ``torch.compile``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import sympy as sp
import torch

from ..divergences import Divergence
from .generic import FAR_X, TAYLOR_RADIUS, UU, GeneratorFunctions, L, SideFunction, T, X, Y, generator_functions
from .numpy_backend import D_MAX, LOG_P_TINY, Q_NEAR_ONE, STEP_TOLERANCE, p_one_lower

__all__ = ["ITERATIONS", "band_log", "band_log_function", "band_log_numpy"]

#: Fixed number of safeguarded Newton iterations per root.
ITERATIONS = 24

_NAMESPACE = {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "Abs": torch.abs, "pi": math.pi, "E": math.e}


@dataclass(frozen=True)
class TorchFunctions:
    gf: GeneratorFunctions
    phi_r: Callable
    dphi_r: Callable
    f_s: Callable
    k_s: Callable


def _vectorise(fn: SideFunction) -> Callable:
    closed = sp.lambdify((X, L, UU), fn.closed, modules=[_NAMESPACE], cse=True)
    taylor = None if fn.taylor is None else sp.lambdify(X, fn.taylor, modules=[_NAMESPACE])
    far = None if fn.far is None else sp.lambdify((T, Y, L), fn.far, modules=[_NAMESPACE], cse=True)

    def evaluate(x: torch.Tensor, log_u: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        value = closed(x, log_u, u) + torch.zeros_like(x)  # broadcast constants
        if taylor is not None:
            value = torch.where(x.abs() < TAYLOR_RADIUS, taylor(x), value)
        if far is not None:
            t = 1.0 / u
            value = torch.where(x > FAR_X, far(t, 1.0 - t, log_u), value)
            value = torch.where((u == math.inf) & value.isnan(), fn.at_infinity, value)  # e.g. 0*log(inf)
        return value

    return evaluate


@lru_cache(maxsize=128)
def torch_functions(divergence: str | Divergence) -> TorchFunctions:
    """The divergence's four functions in torch ops (cached)."""
    gf = generator_functions(divergence)
    return TorchFunctions(gf, *(_vectorise(fn) for fn in gf.functions))


def _cells(lp, lq, p, pc, d):
    """(x_r, log r, r, x_s, log s, s, q) at offset d; see numpy_backend._cells."""
    den = p + torch.exp(-d) / -torch.expm1(-d)  # (1 + pE)/E = p + 1/E, no overflow
    x_r = pc / den  # r - 1 = (1-p)E/(1+pE)
    x_s = -p / den  # s - 1 = -pE/(1+pE)
    b = lp + d
    a = torch.logaddexp(lq, b)  # log(1 + pE) = log((1-p) + p e^d)
    tiny = (lp < LOG_P_TINY) & (b > -40.0)  # p subnormal: build from logs
    # log r = d - a, without forming lp + d - lp when d >> |lp|
    log_r_tiny = torch.where(b > lq, -lp - torch.log1p(torch.exp(lq - b)), d - lq - torch.log1p(torch.exp(b - lq)))
    x_r = torch.where(tiny, torch.expm1(log_r_tiny), x_r)
    x_s = torch.where(tiny, torch.expm1(-a), x_s)
    log_r = torch.where(tiny, log_r_tiny, torch.log1p(x_r))
    far = x_s < -0.5
    log_s = torch.where(far, -a, torch.log1p(x_s))  # log s = -log(1+pE)
    r = 1.0 + x_r
    s = torch.where(far, torch.exp(log_s), 1.0 + x_s)
    q = torch.where(lp < LOG_P_TINY, torch.exp(lp + log_r), p * r)  # q = p r
    return x_r, log_r, r, x_s, log_s, s, q


def _g_and_slope(fns: TorchFunctions, lp, lq, p, pc, d):
    x_r, log_r, r, x_s, log_s, s, q = _cells(lp, lq, p, pc, d)
    g = q * fns.phi_r(x_r, log_r, r) + pc * fns.f_s(x_s, log_s, s)  # p f(r) = q f(r)/r
    slope = q * (pc * s * fns.dphi_r(x_r, log_r, r) - pc * fns.k_s(x_s, log_s, s))  # 1 - q = (1-p) s
    return g, slope


def _g_saturated(fns: TorchFunctions, lp, pc):
    """G(d = inf) = Phi(1/p) + (1-p) f(0)."""
    gf = fns.gf
    normal = lp >= LOG_P_TINY
    x = torch.where(normal, torch.expm1(-lp), torch.zeros_like(lp))  # 1/p - 1
    phi = torch.where(normal, fns.phi_r(x, -lp, 1.0 + x), gf.slope_at_infinity)
    if math.isfinite(gf.f_at_zero):
        return phi + pc * gf.f_at_zero
    return phi + torch.where(pc > 0, math.inf, 0.0)


def _start(gf: GeneratorFunctions, p, pc, delta):
    """Small-δ root of G ≈ p(1-p)(κ d + f''(1) d²/2)."""
    c = p * pc
    if gf.f2 > 0:
        return (torch.sqrt(gf.kink**2 + 2.0 * gf.f2 * delta / c) - gf.kink) / gf.f2
    if gf.kink > 0:
        return delta / (gf.kink * c)
    return torch.ones_like(p)


def _step(g, slope, d, lo, hi, d_prev, g_prev, delta):
    """One safeguarded step; the same rule as numpy_backend._step."""
    inside = g <= delta
    lo = torch.where(inside, torch.maximum(lo, d), lo)
    hi = torch.where(inside, hi, torch.minimum(hi, d))
    rate = slope / g  # d log G / dd
    log_ratio = torch.log(delta / g)
    linear = d + (delta - g) / slope
    exponential = d + log_ratio / rate
    power = d * torch.exp(log_ratio / (rate * d))
    log_seen = torch.log(g_prev / g)
    error_linear = torch.nan_to_num(torch.abs(torch.log1p(rate * (d_prev - d)) - log_seen), nan=math.inf)
    error_exponential = torch.nan_to_num(torch.abs(rate * (d_prev - d) - log_seen), nan=math.inf)
    error_power = torch.abs(rate * d * torch.log(d_prev / d) - log_seen)
    candidate = torch.where(error_linear < error_exponential, linear, exponential)
    best = torch.minimum(error_linear, error_exponential)
    candidate = torch.where(error_power.isnan() | (error_power <= best), power, candidate)
    # a step from an overflowed G or slope (inf) says nothing about convergence
    converged = (torch.abs(candidate - d) <= STEP_TOLERANCE * d) & torch.isfinite(g) & torch.isfinite(slope)
    shrinking = (hi >= D_MAX) | ~(torch.abs(candidate - d) > 0.5 * torch.abs(d - d_prev))
    ok = converged | ((candidate > lo) & (candidate < hi) & shrinking)
    floor = torch.where(lo > 0, lo, torch.clamp(0.125 * hi, max=1.0))  # d ~ 1: natural scale of a logit
    middle = torch.where(hi > 4.0 * floor, torch.sqrt(floor) * torch.sqrt(hi), 0.5 * (lo + hi))
    candidate = torch.where(ok, candidate, middle)
    converged = converged | ((hi - lo) <= 4e-16 * hi)
    return candidate, lo, hi, converged


def _solve_offset(fns: TorchFunctions, lp, lq, delta):
    """Root d of G(d) = delta (fixed ITERATIONS; converged tokens frozen)."""
    p, pc = torch.exp(lp), torch.exp(lq)
    d = _start(fns.gf, p, pc, delta)
    d_cap = torch.clamp(Q_NEAR_ONE + lq - lp, min=Q_NEAR_ONE)  # logit q = 40: G ~ G(inf)
    d = torch.where(torch.isfinite(d) & (d > 0), torch.minimum(d, d_cap), d_cap)
    lo = torch.zeros_like(d)
    hi = torch.full_like(d, D_MAX)
    d_prev = torch.full_like(d, math.nan)
    g_prev = torch.full_like(d, math.nan)
    done = torch.zeros_like(d, dtype=torch.bool)
    for _ in range(ITERATIONS):
        g, slope = _g_and_slope(fns, lp, lq, p, pc, d)
        candidate, lo, hi, converged = _step(g, slope, d, lo, hi, d_prev, g_prev, delta)
        d_prev, g_prev = d, g
        d = torch.where(done, d, candidate)
        done = done | converged
    return d


def band_log_function(divergence: str | Divergence, delta: float) -> Callable:
    """A pure tensor function ``old_log_prob_fp64 -> (log r_lo, log r_up)`` for one (divergence, δ).

    Everything symbolic (the generated functions, the p = 1 value) is resolved here, so the returned function
    holds only torch ops with a fixed iteration count: pass it to ``torch.compile``.  KL uses the specialised
    kernel :func:`.kl.band_log_torch`, TV and Pearson their closed forms (:mod:`.closed`).
    """
    from . import closed, kl

    delta = float(delta)
    if kl.is_kl(divergence):  # the specialised Halley kernel

        def kl_kernel(old_log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return kl.band_log_torch(old_log_prob, delta)

        return kl_kernel
    kind = closed.closed_form_kind(divergence)
    if kind is not None:  # tv, pearson: closed forms

        def closed_kernel(old_log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return closed.band_log_torch(kind, old_log_prob, delta)

        return closed_kernel
    fns = torch_functions(divergence)
    at_one = p_one_lower(fns.gf.divergence, delta)

    def kernel(old_log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _band_log(fns, old_log_prob, delta, at_one)

    return kernel


def _band_log(fns: TorchFunctions, old_log_prob: torch.Tensor, delta: float, at_one: float):
    lp = old_log_prob.to(torch.float64)
    regular = (lp < 0) & (lp > -math.inf)
    lp_safe = torch.where(regular, lp, -1.0)  # placeholder for the others, overwritten below
    lq = torch.log(-torch.expm1(lp_safe))  # log(1-p) = log(-expm1(log p)), exact near p = 1
    n = lp.numel()
    both_lp = torch.cat([lp_safe.reshape(-1), lq.reshape(-1)])
    both_lq = torch.cat([lq.reshape(-1), lp_safe.reshape(-1)])
    saturated = _g_saturated(fns, both_lp, torch.exp(both_lq)) <= delta
    # 1 - p < e^-700: 1/p - r_up < 1e-300 s with f(s) ~ delta/(1-p), so log r_up = -log p to the last bit
    exact = torch.cat([both_lq[:n] < LOG_P_TINY, torch.zeros_like(saturated[n:])])
    saturated = saturated | exact
    d = _solve_offset(fns, both_lp, both_lq, delta)
    _, log_r, _, _, log_s, _, _ = _cells(both_lp, both_lq, torch.exp(both_lp), torch.exp(both_lq), d)
    # saturated: r_up = 1/p exactly; else r_up <= 1/p (a rounding excess near q = 1 is cut)
    upper = torch.where(saturated[:n], -both_lp[:n], torch.minimum(log_r[:n], -both_lp[:n])).reshape(lp.shape)
    lower = torch.where(saturated[n:], -math.inf, log_s[n:]).reshape(lp.shape)  # mirror: log r_lo = log s'
    nan = torch.full_like(lp, math.nan)
    lower = torch.where(regular, lower, torch.where(lp == 0, at_one, torch.where(lp == -math.inf, -math.inf, nan)))
    upper = torch.where(regular, upper, torch.where(lp == 0, 0.0, torch.where(lp == -math.inf, math.inf, nan)))
    return lower, upper


#: Tokens per chunk.  The solver keeps a few dozen chunk-sized float64 temporaries alive, so chunking bounds
#: its memory by a constant (~30 MB on CPU, ~2 GB on an accelerator) instead of ~60x the outputs; on an
#: accelerator the chunk stays large enough to amortise kernel launches.  Slicing needs no host sync.
CHUNK = {"cpu": 1 << 16}
CHUNK_ACCELERATOR = 1 << 22


def band_log(divergence: str | Divergence, old_log_prob: torch.Tensor, delta: float):
    """(log r_lo, log r_up), float64 tensors on the input's device (kernel conventions of numpy_backend)."""
    with torch.no_grad():
        kernel = band_log_function(divergence, delta)
        chunk = CHUNK.get(old_log_prob.device.type, CHUNK_ACCELERATOR)
        if old_log_prob.numel() <= chunk:
            return kernel(old_log_prob)
        flat = old_log_prob.reshape(-1)
        lower = torch.empty(flat.shape, dtype=torch.float64, device=flat.device)
        upper = torch.empty_like(lower)
        for start in range(0, flat.numel(), chunk):  # a loop over chunks, never over tokens
            lower[start : start + chunk], upper[start : start + chunk] = kernel(flat[start : start + chunk])
        return lower.reshape(old_log_prob.shape), upper.reshape(old_log_prob.shape)


def band_log_numpy(divergence: str | Divergence, old_log_prob: np.ndarray, delta: float):
    """:func:`band_log` for a float64 NumPy array (through CPU torch); returns NumPy arrays."""
    lower, upper = band_log(divergence, torch.from_numpy(np.asarray(old_log_prob, dtype=np.float64)), delta)
    return lower.numpy(), upper.numpy()

r"""The Band of a token: ratio bounds for arrays of old log-probabilities — :func:`band` and :func:`band_log`.

For a token with old probability :math:`p = e^{\text{old\_log\_prob}}` and an f-divergence trust region of
radius :math:`\delta`, the Band is the interval of ratios :math:`r = \pi/\pi_{old}` with

.. math::  g_f(p, r) = p\,\tilde f(r) + (1-p)\,\tilde f\!\left(\frac{1 - pr}{1-p}\right) \le \delta,

(:math:`\tilde f(u) = f(u) - f'(1)(u-1)`), i.e. :math:`[r_{lo}, r_{up}] \ni 1` (MATH.md §2).  The upper bound
saturates at :math:`1/p` (all mass on the token) iff :math:`g_f(p, 1/p) \le \delta`; the lower at 0 iff
:math:`g_f(p, 0) \le \delta`.

Numerical contract (tested against the 50-digit oracle :mod:`bandcore.oracle`):

* fp64: :math:`|\Delta \log r| \le 10^{-12}\max(1, |\log r|)` for :math:`\log p \in [-700, 0)` and
  :math:`\delta \in [10^{-8}, 10]`, every divergence (catalogue and :meth:`Divergence.from_expression`) and
  every backend.  Saturated bounds are exact: ``log_upper == -old_log_prob``, ``log_lower == -inf``.
* fp32 / fp16 / bf16 inputs are computed in fp64 and rounded once to the input dtype (also on GPU: the torch
  backend always computes in float64, whose error there is the fp64 error above).
* :math:`\log p = 0` (p = 1): :math:`\log r_{up} = 0` and :math:`r_{lo}` is the limit :math:`p \to 1` under the
  perspective convention :math:`0\cdot\tilde f(x/0) = x\sigma_\infty`, :math:`\sigma_\infty = \lim \tilde f(u)/u`:
  the root of :math:`\tilde f(r) + (1-r)\sigma_\infty = \delta`.  Catalogue values: kl :math:`e^{-\delta}`;
  tv :math:`1-\delta`; pearson, reverse_kl, alpha(α > 1): 1 (:math:`\sigma_\infty = \infty`); neyman
  :math:`1/(1+\delta)`; hellinger :math:`(1-\delta/2)^2`; lecam :math:`(2-\delta)/(2+\delta)`; js and
  alpha(α < 1) numeric; a lower bound that saturates there is 0.
* :math:`\log p = -\infty` (p = 0): ``(lower, upper) = (0, +inf)`` (logs ``(-inf, +inf)``).
* NaN in → NaN out (both bounds).  Empty arrays → empty outputs.

Properties: lower ≤ 1 ≤ upper; upper non-increasing and lower non-decreasing in p; nested in δ; mirror
symmetric :math:`q_{lo}(p) = 1 - q_{up}(1-p)`.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from .divergences import Divergence, get_divergence

__all__ = ["AUTO_NUMBA_MIN_SIZE", "BACKENDS", "DELTA_MAX", "LOG_P_TOLERANCE", "band", "band_log"]

#: Accepted backends.  "auto": tensors on an accelerator → "torch"; NumPy arrays and CPU tensors → "numba"
#: from AUTO_NUMBA_MIN_SIZE tokens on, "numpy" below (measured: below ~10^4 tokens NumPy's vectorised solver
#: is as fast or faster than a parallel Numba launch, whose OpenMP wake-up alone costs up to ~10 ms on a
#: busy 2-core machine; the fixed-iteration torch solver is meant for GPUs and is 10-40x slower on a CPU).
BACKENDS = ("auto", "numpy", "numba", "torch")
AUTO_NUMBA_MIN_SIZE = 20_000

#: log p in (0, LOG_P_TOLERANCE] is rounding noise of a log-softmax and is read as 0 (p = 1); larger
#: positive values raise ValueError (check=True) or give NaN (check=False).
LOG_P_TOLERANCE = 1e-6

#: Largest accepted δ (the contract range is [1e-8, 10]; up to this the solvers are still exact).
DELTA_MAX = 1e3


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _check_delta(delta: Any) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.integer, np.floating)):
        if not (hasattr(delta, "ndim") and getattr(delta, "ndim", 1) == 0):
            raise TypeError(f"delta must be a real number, got {delta!r} ({type(delta).__name__})")
    value = float(delta)
    if not (math.isfinite(value) and 0 < value <= DELTA_MAX):
        raise ValueError(f"delta must be finite with 0 < delta <= {DELTA_MAX:g}, got delta={value!r}")
    return value


def _check_backend(backend: str, on_accelerator: bool, size: int) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got backend={backend!r}")
    if backend == "auto":
        if on_accelerator:
            return "torch"
        return "numba" if size >= AUTO_NUMBA_MIN_SIZE else "numpy"
    return backend


def _numpy_input(old_log_prob: Any) -> np.ndarray:
    x = np.asarray(old_log_prob)
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        raise TypeError(
            f"old_log_prob must be a floating-point array (log-probabilities), got dtype {x.dtype} "
            f"(value {old_log_prob!r:.80})"
        )
    return x


def _checked_log_prob(lp: np.ndarray, check: bool) -> np.ndarray:
    """fp64 log p with (0, tol] clamped to 0; with check=True values above tol raise."""
    positive = lp > 0
    if positive.any():
        if check:
            _raise_if_above(lp)
        lp = np.where(positive & (lp <= LOG_P_TOLERANCE), 0.0, lp)
    return lp


def _raise_if_above(lp: np.ndarray) -> None:
    beyond = lp > LOG_P_TOLERANCE
    if beyond.any():
        bad = lp[beyond]
        raise ValueError(
            f"old_log_prob must be <= 0 (log-probabilities; up to {LOG_P_TOLERANCE:g} is read as 0), "
            f"got {bad.size} value(s) above, e.g. old_log_prob={float(bad.flat[0])!r}"
        )


def _numpy_kernel(backend: str):
    if backend == "numpy":
        from .kernels.numpy_backend import band_log as kernel
    elif backend == "numba":
        from .kernels.numba_backend import band_log as kernel
    else:
        from .kernels.torch_backend import band_log_numpy as kernel
    return kernel


def _band_log_numpy(x: np.ndarray, div: Divergence, delta: float, backend: str, check: bool):
    lp = _checked_log_prob(np.asarray(x, dtype=np.float64), check)
    if lp.size == 0:
        return np.empty(lp.shape), np.empty(lp.shape)
    return _numpy_kernel(backend)(div, lp, delta)


def _band_log_torch(x, div: Divergence, delta: float, backend: str, check: bool):
    import torch

    if not torch.is_floating_point(x):
        raise TypeError(f"old_log_prob must be a floating-point tensor (log-probabilities), got dtype {x.dtype}")
    with torch.no_grad():
        lp = x.detach().to(torch.float64)
        if check:  # one host synchronisation, at the boundary only (check=False avoids it)
            beyond = lp > LOG_P_TOLERANCE
            if bool(beyond.any()):
                raise ValueError(
                    f"old_log_prob must be <= 0 (log-probabilities; up to {LOG_P_TOLERANCE:g} is read as 0), "
                    f"got {int(beyond.sum())} value(s) above, e.g. old_log_prob={float(lp[beyond][0])!r}"
                )
        lp = torch.where((lp > 0) & (lp <= LOG_P_TOLERANCE), torch.zeros_like(lp), lp)
        if lp.numel() == 0:
            return torch.empty_like(lp), torch.empty_like(lp)
        if backend == "torch":
            from .kernels.torch_backend import band_log as kernel

            return kernel(div, lp, delta)
        lower, upper = _numpy_kernel(backend)(div, lp.cpu().numpy(), delta)
        return torch.from_numpy(lower).to(lp.device), torch.from_numpy(upper).to(lp.device)


def _compute(old_log_prob, divergence, delta, backend, check, transform):
    div = get_divergence(divergence)
    delta = _check_delta(delta)
    if _is_torch(old_log_prob):
        backend = _check_backend(backend, old_log_prob.device.type != "cpu", old_log_prob.numel())
        lower, upper = _band_log_torch(old_log_prob, div, delta, backend, check)
        import torch

        with torch.no_grad():
            lower, upper = transform(lower), transform(upper)
            return lower.to(old_log_prob.dtype), upper.to(old_log_prob.dtype)
    x = _numpy_input(old_log_prob)
    backend = _check_backend(backend, False, x.size)
    from .kernels import closed

    if backend == "numba" and x.dtype in closed.FUSED_DTYPES and x.size and closed.closed_form_kind(div):
        # tv, pearson: one fused pass (check, clamp, bounds, exp, rounding to the input dtype)
        lower, upper, above = closed.band_fused(closed.closed_form_kind(div), x, delta, ratios=transform is _exp)
        if check and above:
            _raise_if_above(x)
        return lower, upper
    lower, upper = _band_log_numpy(x, div, delta, backend, check)
    with np.errstate(over="ignore", under="ignore"):
        lower, upper = np.asarray(transform(lower)), np.asarray(transform(upper))  # 0-d stays an ndarray
        return lower.astype(x.dtype, copy=False), upper.astype(x.dtype, copy=False)


def band_log(
    old_log_prob: Any,
    divergence: str | Divergence = "kl",
    delta: float = 0.05,
    *,
    backend: str = "auto",
    check: bool = True,
) -> tuple[Any, Any]:
    r"""Log-ratio bounds :math:`(\log r_{lo}, \log r_{up})` of the Band, element-wise.

    Parameters
    ----------
    old_log_prob : array_like or torch.Tensor
        :math:`\log \pi_{old}(a)` of the sampled tokens, any shape, floating dtype (fp64, fp32, fp16, bf16).
        Python floats and lists are accepted (→ ndarray).  Integer dtypes raise :class:`TypeError`.
    divergence : str or Divergence
        Name or alias (``"kl"``, ``"bandtv"``, ...) or a :class:`~bandcore.Divergence` (e.g. from
        :meth:`Divergence.from_expression`).
    delta : float
        Trust-region radius :math:`\delta`, finite, :math:`0 < \delta \le` :data:`DELTA_MAX`.
    backend : {"auto", "numpy", "numba", "torch"}
        Which solver; all meet the same contract.  "auto" picks torch for tensors on an accelerator, and for
        NumPy arrays and CPU tensors Numba from :data:`AUTO_NUMBA_MIN_SIZE` tokens on, NumPy below (the
        first Numba call of a divergence compiles its kernel, ~2-10 s, cached on disk).
    check : bool
        Raise :class:`ValueError` for :math:`\log p >` :data:`LOG_P_TOLERANCE` (a torch input then costs one
        host synchronisation); with ``False`` such entries give NaN.

    Returns
    -------
    (log_lower, log_upper)
        Same kind (ndarray / tensor), shape and dtype as the input (torch: same device, no gradient);
        :math:`\log r_{lo} \le 0 \le \log r_{up}`, ``-inf`` for a saturated lower bound and exactly
        ``-old_log_prob`` for a saturated upper one.  See the module docstring for the full contract.
    """
    return _compute(old_log_prob, divergence, delta, backend, check, lambda v: v)


def band(
    old_log_prob: Any,
    divergence: str | Divergence = "kl",
    delta: float = 0.05,
    *,
    backend: str = "auto",
    check: bool = True,
) -> tuple[Any, Any]:
    r"""Ratio bounds :math:`(r_{lo}, r_{up})` of the Band: ``exp`` of :func:`band_log`, rounded once.

    Same arguments and contract as :func:`band_log`; a saturated lower bound is 0 and a saturated upper one
    :math:`1/p`.  The KL lower bound underflows to 0 for :math:`\delta \gg p` (it is about
    :math:`e^{-1-\delta/p}`): use :func:`band_log` when that matters.
    """
    return _compute(old_log_prob, divergence, delta, backend, check, _exp)


def _exp(values):
    if _is_torch(values):
        return values.exp()
    return np.exp(values)


# ------------------------------------------------------------------------------------------------------------
# `bandcore bounds`
# ------------------------------------------------------------------------------------------------------------


def register_cli(subparsers) -> None:
    """Add ``bandcore bounds``."""
    parser = subparsers.add_parser(
        "bounds",
        help="print the Band [lower, upper] for some token probabilities, next to PPO's clip",
        description="Print the Band of each token probability p, its Δπ range, and PPO's [1-ε, 1+ε].",
    )
    parser.add_argument("--divergence", default="kl", help="name, alias or formula in u (default: kl)")
    parser.add_argument("--delta", type=float, default=0.05, help="trust-region radius δ (default: 0.05)")
    parser.add_argument("--p", type=float, nargs="+", default=[0.001, 0.08, 0.5, 0.99], help="probabilities")
    parser.add_argument("--eps", type=float, default=0.2, help="PPO clip ε for comparison (default: 0.2)")
    parser.set_defaults(handler=_bounds_command)


def _resolve_divergence(text: str) -> Divergence:
    try:
        return get_divergence(text)
    except ValueError:
        if "u" not in text:
            raise
        return Divergence.from_expression(text)


def _bounds_command(args) -> int:
    div = _resolve_divergence(args.divergence)
    p = np.asarray(args.p, dtype=np.float64)
    if np.any(~(p > 0) | ~(p <= 1)):
        raise ValueError(f"--p values must lie in (0, 1], got {args.p}")
    if not (math.isfinite(args.eps) and 0 < args.eps < 1):
        raise ValueError(f"--eps must lie in (0, 1), got {args.eps!r}")
    lower, upper = band(np.log(p), div, args.delta)
    print(f"Band of {div.name} at delta = {args.delta:g}   (PPO clip eps = {args.eps:g})")
    header = (
        f"{'p':>10} {'lower':>12} {'upper':>12} {'dpi_min':>12} {'dpi_max':>12}   "
        f"{'ppo_lower':>9} {'ppo_upper':>9} {'ppo_dpi_min':>11} {'ppo_dpi_max':>11}"
    )
    print(header)
    lo_ppo, up_ppo = 1 - args.eps, 1 + args.eps
    for pi, lo, up in zip(p, lower, upper, strict=True):
        ppo_up = min(up_ppo, 1 / pi)  # PPO cannot raise π above 1 either
        print(
            f"{pi:>10.4g} {lo:>12.6g} {up:>12.6g} {pi * (lo - 1):>12.6g} {pi * (up - 1):>12.6g}   "
            f"{lo_ppo:>9.4g} {ppo_up:>9.4g} {pi * (lo_ppo - 1):>11.4g} {pi * (ppo_up - 1):>11.4g}"
        )
    return 0

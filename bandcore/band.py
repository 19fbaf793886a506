r"""The Band of a token: ratio bounds for arrays of old log-probabilities — :func:`band` and :func:`band_log`.

For a token with old probability :math:`p = e^{\text{old\_log\_prob}}` and an f-divergence trust region of
radius :math:`\delta`, the Band is the interval of ratios :math:`r = \pi/\pi_{old}` with

.. math::  g_f(p, r) = p\,\tilde f(r) + (1-p)\,\tilde f\!\left(\frac{1 - pr}{1-p}\right) \le \delta,

(:math:`\tilde f(u) = f(u) - f'(1)(u-1)`), i.e. :math:`[r_{lo}, r_{up}] \ni 1`.  The upper bound
saturates at :math:`1/p` (all mass on the token) iff :math:`g_f(p, 1/p) \le \delta`; the lower at 0 iff
:math:`g_f(p, 0) \le \delta`.

Numerical contract (tested against the 50-digit oracle :mod:`bandcore.oracle`):

* fp64: :math:`|\Delta \log r| \le 10^{-12}\max(1, |\log r|)` for every finite :math:`\log p \le 0` and
  :math:`\delta \in [10^{-8}, 10]`, every divergence (catalogue and :meth:`Divergence.from_expression`) and
  every backend (the far tail included: below log p = -700, where p is subnormal or 0 in float64, the
  solvers work in logarithms; a bound beyond the float range is its correctly rounded ±inf, e.g. KL's lower
  bound :math:`\approx -\delta/p` once :math:`\log p < \log\delta - 709.78`).  Saturated bounds are exact:
  ``log_upper == -old_log_prob``, ``log_lower == -inf``.
* Next to a saturation threshold :math:`p^*` the bound is inherently ill-conditioned: rounding p by a relative
  :math:`\epsilon` moves it by about :math:`\epsilon\,p/|p - p^*|` relatively, so at relative distance
  :math:`\eta = |p - p^*|/p^*` the error may reach about :math:`64\,\epsilon/\eta` (tested at
  :math:`\eta = 10^{-6}, 10^{-8}, 10^{-10}` on every backend).  TV and Pearson decide saturation exactly and meet
  the contract at every float log p; the other generators' status and lower bound within a few ulp of
  :math:`\log p^*` are the exact ones of an input within :math:`48 \cdot 2^{-52}` of log p (docs/math.md §3).
  Every token converges within the solver's
  iteration budget.  A bound the solver cannot certify as a root (e.g. a user generator that overflows
  float64 far out, such as ``cosh``) is NaN with status ``NOT_CONVERGED``: never a silent value.
* fp32 / fp16 / bf16 inputs are computed in fp64 and rounded once to the input dtype (also on GPU: the torch
  backend always computes in float64, whose error there is the fp64 error above).
* :math:`\log p = 0` (p = 1): :math:`\log r_{up} = 0` and :math:`r_{lo}` is the limit :math:`p \to 1` under the
  perspective convention :math:`0\cdot\tilde f(x/0) = x\sigma_\infty`, :math:`\sigma_\infty = \lim \tilde f(u)/u`:
  the root of :math:`\tilde f(r) + (1-r)\sigma_\infty = \delta`.  Catalogue values: kl :math:`e^{-\delta}`;
  tv :math:`\max(1-\delta, 0)`; pearson, reverse_kl, alpha(α > 1): 1 (:math:`\sigma_\infty = \infty`); neyman
  :math:`1/(1+\delta)`; hellinger :math:`\max(1-\delta/2, 0)^2`; lecam :math:`\max((2-\delta)/(2+\delta), 0)`; js
  and alpha(α < 1) numeric (0 once δ reaches the divergence's supremum, where every p saturates).
* :math:`\log p = -\infty` (p = 0): ``(lower, upper) = (0, +inf)`` (logs ``(-inf, +inf)``).
* NaN in → NaN out (both bounds, status ``INVALID_INPUT``).  Empty arrays → empty outputs.

Properties: lower ≤ 1 ≤ upper; upper non-increasing and lower non-decreasing in p; nested in δ; mirror
symmetric :math:`q_{lo}(p) = 1 - q_{up}(1-p)`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._contract import (
    LOG_P_TOLERANCE,
    Status,
    above_tolerance_error,
    check_backend,
    check_log_prob_array,
    is_torch_tensor,
)
from .divergences import Divergence, resolve_region
from .kernels import backends

__all__ = ["AUTO_NUMBA_MIN_SIZE", "band", "band_log", "torch_function"]

#: "auto": tensors on an accelerator -> "torch"; NumPy arrays and CPU tensors -> "numba" from this many tokens
#: on, "numpy" below.  Once compiled, Numba is the faster at every size (10 KL tokens: 15 µs against 274 µs), but
#: its first call for a divergence compiles for seconds, which a few small calls never earn back.
AUTO_NUMBA_MIN_SIZE = 20_000

#: Tokens per torch chunk: the solver keeps a few dozen chunk-sized float64 temporaries alive, so chunking
#: bounds its memory by a constant; on an accelerator the chunk stays large enough to amortise launches.
TORCH_CHUNK = {"cpu": 1 << 16}
TORCH_CHUNK_ACCELERATOR = 1 << 22


def _pick(backend: str, on_accelerator: bool, size: int) -> str:
    if backend != "auto":
        return backend
    if on_accelerator:
        return "torch"
    return "numba" if size >= AUTO_NUMBA_MIN_SIZE else "numpy"


def _numpy_bounds(x: np.ndarray, div: Divergence, delta: float, backend: str, check: bool, ratios: bool):
    """(lower, upper, status) for an ndarray, outputs in the input's float dtype."""
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float64)
    if backend == "numba" and x.size:
        lower, upper, status, above = backends.run_numba(div, x.astype(dtype, copy=False), delta, ratios=ratios)
        if check and above:
            bad = x[x > LOG_P_TOLERANCE]
            raise above_tolerance_error(bad.size, float(bad.flat[0]))
        return lower, upper, status
    lp = np.asarray(x, dtype=np.float64)
    above = lp > LOG_P_TOLERANCE
    if check and above.any():
        raise above_tolerance_error(int(above.sum()), float(lp[above].flat[0]))
    lp = np.where((lp > 0) & ~above, 0.0, lp)
    if backend == "torch":
        import torch

        lower, upper, status = _torch_bounds(torch.from_numpy(lp), div, delta, ratios)
        return lower.numpy().astype(dtype), upper.numpy().astype(dtype), status.numpy()
    with np.errstate(all="ignore"):
        solve = backends.solve_ratio_arrays if ratios else backends.solve_arrays
        lower, upper, status = solve(
            backends.solver_module("numpy", div), backends.solver_kind(div), lp.reshape(-1), delta,
            backends.lower_at_one(div, delta), backends.seed(div, delta).numpy_arrays(),
        )
    shape = lp.shape
    return (np.asarray(lower, dtype=dtype).reshape(shape), np.asarray(upper, dtype=dtype).reshape(shape),
            np.asarray(status, dtype=np.int8).reshape(shape))


def torch_function(divergence: Any, delta: float, device: Any = "cpu"):
    """A pure tensor function ``old_log_prob_fp64 -> (log_lower, log_upper, status)`` for one (divergence, δ)
    and tensors on ``device``.

    Everything symbolic (and the seed table) is resolved here, so the function holds only torch ops: pass it
    to ``torch.compile``.  On an accelerator, or while compiling, the safeguarded solver behind the seeded pass
    runs on every token for its full iteration count, with no host synchronisation; on the CPU (where a check
    costs no synchronisation) it runs only on the tokens the seeded pass left, and stops once they converge.
    Input conventions as :func:`band_log` with ``check=False`` (values in (0, tol] must already be clamped to 0).
    """
    solve = _torch_solver(*resolve_region(divergence, delta), device)

    def kernel(old_log_prob):
        lower, upper, status = solve(old_log_prob.reshape(-1))
        return lower.reshape(old_log_prob.shape), upper.reshape(old_log_prob.shape), status.reshape(old_log_prob.shape)

    return kernel


def _torch_solver(div: Divergence, delta: float, device: Any, ratios: bool = False):
    """``solve(flat_lp, fallback=True)``: :func:`backends.solve_arrays` bound to (div, δ) and ``device``; with
    ``ratios``, :func:`backends.solve_ratio_arrays` (for a kind with a ratio form: :func:`backends.has_ratio_form`)."""
    import torch

    module, kind = backends.solver_module("torch", div), backends.solver_kind(div)
    at_one = backends.lower_at_one(div, delta)
    seed = backends.torch_seed(div, delta, str(torch.device(device)))

    def solve(flat, fallback=True):
        if ratios:
            return backends.solve_ratio_arrays(module, kind, flat, delta, at_one, seed)
        return backends.solve_arrays(module, kind, flat, delta, at_one, seed, fallback=fallback)

    return solve


def _torch_bounds(lp, div: Divergence, delta: float, ratios: bool):
    """(lower, upper, status) in float64 / int8 on lp's device, solved in chunks (no host synchronisation).

    Where selecting tokens is free (the CPU), the chunks run the seeded pass only and the safeguarded solver
    then runs once on every token it left (:func:`_solve_left_numba`), so its iteration overhead is paid once
    per call, not per chunk."""
    import torch

    direct = ratios and backends.has_ratio_form(div)  # the ratios themselves (TV, Pearson)
    solve = _torch_solver(div, delta, lp.device, ratios=direct)
    chunk = TORCH_CHUNK.get(lp.device.type, TORCH_CHUNK_ACCELERATOR)
    flat = lp.reshape(-1)
    later = backends.can_select(flat) and not direct
    lower = torch.empty(flat.shape, dtype=torch.float64, device=flat.device)
    upper = torch.empty_like(lower)
    status = torch.empty(flat.shape, dtype=torch.int8, device=flat.device)
    for start in range(0, flat.numel(), chunk):  # a loop over chunks, never over tokens
        part = slice(start, start + chunk)
        lower[part], upper[part], status[part] = solve(flat[part], fallback=not later)
    if later:
        redo = (status == int(Status.NOT_CONVERGED)).nonzero().reshape(-1)
        for start in range(0, redo.numel(), chunk):
            index = redo[start : start + chunk]
            lo, up, st = (torch.from_numpy(v) for v in _solve_left_numba(div, delta, flat[index].numpy()))
            lower[index], upper[index], status[index] = lo, up, st.to(torch.int8)
    if ratios and not direct:
        lower, upper = lower.exp(), upper.exp()
    return lower.reshape(lp.shape), upper.reshape(lp.shape), status.reshape(lp.shape)


def _solve_left_numba(div: Divergence, delta: float, lp: np.ndarray) -> tuple:
    """The tokens of a CPU tensor that the seeded pass left (next to a saturation threshold, or without a seed),
    solved again by the compiled (Numba) binding of the same solver: seeded pass, refined passes, safeguarded
    solver.  Its iterations cost microseconds where NumPy's cost ~0.2 ms (per-operation overhead on a few
    hundred tokens): 10k mid tokens, 1 thread, tokens left: js 4.75 -> 0.05 ms, alpha(0.7) 6.5 -> 0.05 ms."""
    lower, upper, status, _ = backends.run_numba(div, lp, delta)
    return lower, upper, status


def _tensor_bounds(x, div: Divergence, delta: float, backend: str, check: bool, ratios: bool):
    import torch

    with torch.no_grad():
        lp = x.detach().to(torch.float64)
        if check:  # one host synchronisation, at the boundary only (check=False avoids it)
            above = lp > LOG_P_TOLERANCE
            if bool(above.any()):
                raise above_tolerance_error(int(above.sum()), float(lp[above][0]))
        if backend == "torch":
            lp = torch.where((lp > 0) & (lp <= LOG_P_TOLERANCE), 0.0, lp)
            lower, upper, status = _torch_bounds(lp, div, delta, ratios)
        else:
            lower, upper, status = _numpy_bounds(lp.cpu().numpy(), div, delta, backend, False, ratios)
            lower, upper, status = (torch.from_numpy(v).to(x.device) for v in (lower, upper, status))
        return lower.to(x.dtype), upper.to(x.dtype), status


def _compute(old_log_prob, divergence, delta, backend, check, ratios, return_status):
    div, delta = resolve_region(divergence, delta)  # a transform's radius is mapped here, once
    backend = check_backend(backend)
    x = check_log_prob_array(old_log_prob)
    if is_torch_tensor(x):
        backend = _pick(backend, x.device.type != "cpu", x.numel())
        result = _tensor_bounds(x, div, delta, backend, check, ratios)
    else:
        result = _numpy_bounds(x, div, delta, _pick(backend, False, x.size), check, ratios)
    return result if return_status else result[:2]


def band_log(
    old_log_prob: Any,
    divergence: str | Divergence = "kl",
    delta: float = 0.05,
    *,
    backend: str = "auto",
    check: bool = True,
    return_status: bool = False,
) -> tuple[Any, ...]:
    r"""Log-ratio bounds :math:`(\log r_{lo}, \log r_{up})` of the Band, element-wise.

    Parameters
    ----------
    old_log_prob : array_like or torch.Tensor
        :math:`\log \pi_{old}(a)` of the sampled tokens, any shape, floating dtype (fp64, fp32, fp16, bf16).
        Python floats and lists are accepted (→ ndarray).  Integer dtypes raise :class:`TypeError`.
    divergence : str or Divergence
        Any spelling of the grammar: a name or alias (``"kl"``, ``"bandtv"``), ``"alpha(0.5)"``, a formula in
        ``u`` or a :class:`~bandcore.Divergence`; or a monotone transform of an f-divergence (``"renyi(2)"``,
        ``"chernoff(0.3)"``, ``"bhattacharyya"``), whose radius is mapped exactly to its f-divergence's
        (:func:`bandcore.divergences.resolve_region`).
    delta : float
        Trust-region radius :math:`\delta`, finite, :math:`0 < \delta \le 1000` (for a transform: its mapped
        radius at most 1000).
    backend : {"auto", "numpy", "numba", "torch"}
        Which binding of the one solver; all meet the same contract.  "auto" picks torch for tensors on an
        accelerator, and for NumPy arrays and CPU tensors Numba from :data:`AUTO_NUMBA_MIN_SIZE` tokens on,
        NumPy below (the first Numba call of a divergence compiles its kernel, cached on disk).  "torch" on a
        CPU tensor runs the seeded pass in torch ops and solves the few tokens it leaves (next to a saturation
        threshold: ~1-3 %) with the Numba binding, which compiles on its first call as "numba" does.
    check : bool
        Raise :class:`ValueError` for :math:`\log p > 10^{-6}` (a torch input then costs one host
        synchronisation); with ``False`` such entries give NaN and status ``INVALID_INPUT``.
    return_status : bool
        Also return the per-element :class:`~bandcore.Status` codes (int8, same shape).

    Returns
    -------
    (log_lower, log_upper) or (log_lower, log_upper, status)
        Same kind (ndarray / tensor), shape and dtype as the input (torch: same device, no gradient);
        :math:`\log r_{lo} \le 0 \le \log r_{up}`, ``-inf`` for a saturated lower bound and exactly
        ``-old_log_prob`` for a saturated upper one.  See the module docstring for the full contract.
    """
    return _compute(old_log_prob, divergence, delta, backend, check, False, return_status)


def band(
    old_log_prob: Any,
    divergence: str | Divergence = "kl",
    delta: float = 0.05,
    *,
    backend: str = "auto",
    check: bool = True,
    return_status: bool = False,
) -> tuple[Any, ...]:
    r"""Ratio bounds :math:`(r_{lo}, r_{up})` of the Band: ``exp`` of :func:`band_log`, rounded once; TV's and
    Pearson's are computed as ratios (:math:`1 \pm \delta/p`, :math:`1 \pm \sqrt{\delta(1-p)/p}`, two
    transcendentals per token and no exp of a log, whose absolute error would become a relative one).

    Same arguments and contract as :func:`band_log`; a saturated lower bound is 0 and a saturated upper one
    :math:`1/p` (``exp(-old_log_prob)``).  The KL lower bound underflows to 0 for :math:`\delta \gg p` (it is about
    :math:`e^{-1-\delta/p}`): use :func:`band_log` when that matters.
    """
    return _compute(old_log_prob, divergence, delta, backend, check, True, return_status)


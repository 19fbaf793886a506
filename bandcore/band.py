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
    above_tolerance_error,
    check_backend,
    check_log_prob_array,
    is_torch_tensor,
)
from .derive import solver_plan
from .divergences import Divergence, resolve_region
from .kernels import backends

__all__ = ["AUTO_NUMBA_MIN_SIZE", "BoundBand", "band", "band_log", "bind", "torch_function"]

#: "auto" on the CPU compiles the Numba kernel of a divergence for calls from this many tokens on (its first
#: compile, seconds, pays off there; below, NumPy runs until the kernel is ready: see :func:`band_log`).
AUTO_NUMBA_MIN_SIZE = backends.NUMBA_MIN_SIZE
_FLOAT64 = np.dtype(np.float64)
#: the float dtypes the kernels compute in and return (others are computed and returned in float64)
_FLOATS = frozenset({np.dtype(np.float32), _FLOAT64})


class BoundBand:
    """The Band of one divergence and δ with its solver bound: ``bound(old_log_prob)`` is :func:`band_log` (or
    :func:`band`, with ``ratios``) without resolving, planning or binding again (made by :func:`bind`)."""

    __slots__ = ("_solvers", "backend", "check", "delta", "divergence", "plan", "ratios")

    def __init__(self, divergence: Any, delta: float, *, backend: str = "auto", ratios: bool = False,
                 check: bool = True) -> None:  # fmt: skip
        self.divergence, self.delta = resolve_region(divergence, delta)  # a transform's radius is mapped here, once
        self.backend = check_backend(backend)
        self.plan = solver_plan(self.divergence)
        self.ratios, self.check = bool(ratios), bool(check)
        self._solvers: dict[tuple[str, str], Any] = {}  # (backend, device) -> the kernels' solver, once bound

    def __repr__(self) -> str:
        return (f"BoundBand({self.divergence.name!r}, delta={self.delta!r}, backend={self.backend!r}, "
                f"ratios={self.ratios})")

    def __call__(self, old_log_prob: Any, *, return_status: bool = False) -> tuple[Any, ...]:
        x = check_log_prob_array(old_log_prob)
        result = self._tensor(x) if is_torch_tensor(x) else self._array(x)
        return result if return_status else result[:2]

    def solver(self, backend: str, device: str = "cpu") -> Any:
        """The kernels' solver this Band runs on ``backend`` (:func:`bandcore.kernels.backends.bind`)."""
        solver = self._solvers.get((backend, device))
        if solver is None:
            solver = self._solvers[backend, device] = backends.bind(self.plan, self.delta, backend, device=device,
                                                                    ratios=self.ratios)  # fmt: skip
        return solver

    def pick(self, size: int, dtype: Any = np.float64, accelerator: bool = False) -> str:
        """The backend a call on ``size`` tokens of ``dtype`` runs on (the rule of ``backend="auto"``:
        :func:`band_log`)."""
        if self.backend != "auto":
            return self.backend
        if accelerator:
            return "torch"
        dtype = np.dtype(dtype)
        dtype = dtype if dtype in _FLOATS else _FLOAT64
        if size >= AUTO_NUMBA_MIN_SIZE or backends.numba_ready(self.plan, self.ratios, dtype, size):
            return "numba"
        return "numpy"

    def _array(self, x: np.ndarray, backend: str | None = None) -> tuple:
        """(lower, upper, status) of an ndarray, outputs in the input's float dtype."""
        dtype = x.dtype if x.dtype in _FLOATS else _FLOAT64
        backend = backend or self.pick(x.size, dtype)
        if backend == "torch":
            import torch

            lp = np.asarray(x, dtype=np.float64)
            self._check_above(lp)
            lower, upper, status, _ = self.solver("torch")(torch.from_numpy(lp.reshape(-1)))
            lower, upper, status = lower.numpy().astype(dtype), upper.numpy().astype(dtype), status.numpy()
        elif backend == "numba" and x.size:
            flat = np.ascontiguousarray(x, dtype=dtype).reshape(-1)
            lower, upper, status, above = self.solver("numba")(flat)
            if above:
                self._check_above(flat)
        else:
            lower, upper, status, above = self.solver("numpy")(x.reshape(-1))
            if above:
                self._check_above(x)
        if x.ndim == 1:
            return lower, upper, status
        shape = x.shape
        return lower.reshape(shape), upper.reshape(shape), status.reshape(shape)

    def _check_above(self, x: Any) -> None:
        if self.check:
            bad = x[x > LOG_P_TOLERANCE]
            if bad.size:
                raise above_tolerance_error(int(bad.size), float(bad.reshape(-1)[0]))

    def _tensor(self, x: Any) -> tuple:
        import torch

        with torch.no_grad():
            lp = x.detach().to(torch.float64)
            if self.check:  # one host synchronisation, at the boundary only (check=False avoids it)
                above = lp > LOG_P_TOLERANCE
                if bool(above.any()):
                    raise above_tolerance_error(int(above.sum()), float(lp[above][0]))
            backend = self.pick(x.numel(), np.float64, accelerator=x.device.type != "cpu")
            if backend != "torch":
                result = self._array(lp.cpu().numpy(), backend)
                lower, upper, status = (torch.from_numpy(v).to(x.device) for v in result)
                return lower.to(x.dtype), upper.to(x.dtype), status
        # torch's solver in inference mode: no autograd bookkeeping per operation (a 10k-token call on the CPU
        # 5-8 % faster than under no_grad); its tensors are made normal ones on the way out (_normal), and the
        # solver, whose tables it keeps, is made outside (torch.compile must not meet inference tensors)
        solver = self.solver("torch", str(lp.device))
        with torch.inference_mode():
            lower, upper, status, _ = solver(lp.reshape(-1))
            lower, upper, status = (v.reshape(lp.shape) for v in (lower, upper, status))
        return _normal(lower, x.dtype), _normal(upper, x.dtype), _normal(status, status.dtype)


def _normal(tensor: Any, dtype: Any) -> Any:
    """``tensor`` in ``dtype`` as a normal tensor, outside inference mode (an inference tensor can be neither saved
    for backward, as a clamp's bound is, nor updated in place there): the cast where the dtype changes, else a
    copy."""
    return tensor.to(dtype) if tensor.dtype != dtype else tensor.clone()


def bind(divergence: str | Divergence = "kl", delta: float = 0.05, *, backend: str = "auto", log: bool = True,
         check: bool = True) -> BoundBand:
    r"""The Band of ``divergence`` at ``delta``, resolved, planned and bound once: a callable
    ``bound(old_log_prob, *, return_status=False)`` that returns what :func:`band_log` (``log=True``) or
    :func:`band` (``log=False``) would for the same arguments, without doing that work again on each call.

    A trainer makes it at start-up and calls it every step.  Arguments as :func:`band_log`; ``backend`` one of
    :data:`bandcore._contract.BACKENDS`.
    """
    return BoundBand(divergence, delta, backend=backend, ratios=not log, check=check)


def torch_function(divergence: Any, delta: float, device: Any = "cpu"):
    """A pure tensor function ``old_log_prob_fp64 -> (log_lower, log_upper, status)`` for one (divergence, δ)
    and tensors on ``device``.

    Everything symbolic (and the seed table) is resolved here, so the function holds only torch ops: pass it
    to ``torch.compile``.  On an accelerator, or while compiling, the safeguarded solver behind the seeded pass
    runs on every token for its full iteration count, with no host synchronisation; on the CPU (where a check
    costs no synchronisation) it runs only on the tokens the seeded pass left, and stops once they converge.
    Input conventions as :func:`band_log` with ``check=False`` (values in (0, tol] must already be clamped to 0).
    """
    import torch

    bound = BoundBand(divergence, delta, backend="torch")
    solve = bound.solver("torch", str(torch.device(device))).pure

    def kernel(old_log_prob):
        lower, upper, status = solve(old_log_prob.reshape(-1))
        return lower.reshape(old_log_prob.shape), upper.reshape(old_log_prob.shape), status.reshape(old_log_prob.shape)

    return kernel


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
        Which binding of the one solver; all meet the same contract.  "auto" picks the fastest binding whose
        kernel is ready: torch for tensors on an accelerator; for NumPy arrays and CPU tensors Numba when its
        kernel for this divergence, output, dtype and size class (serial or parallel driver) has run in this
        process or is in the cache on disk (its machine code is then loaded, not compiled), else Numba from
        :data:`AUTO_NUMBA_MIN_SIZE` tokens on (where its one compile, cached on disk, pays off) and NumPy below.
        So a small call never waits for a compile, and is fast once a kernel is ready.  "torch" on a CPU tensor
        runs the seeded pass in torch ops and solves the few tokens it leaves (next to a saturation threshold:
        ~1-3 %) with the Numba binding, which compiles on its first call as "numba" does.
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
    return BoundBand(divergence, delta, backend=backend, check=check)(old_log_prob, return_status=return_status)


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
    return BoundBand(divergence, delta, backend=backend, ratios=True, check=check)(old_log_prob,
                                                                                 return_status=return_status)


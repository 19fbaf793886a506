r"""Binding the one solver source (:mod:`.solvers`) to a backend, with caches keyed by backend.

* **numpy** / **torch**: a fresh instance of the :mod:`.solvers` module whose ``xp`` is :data:`.ops.numpy_ops`
  or :func:`.ops.torch_ops` and whose per-divergence globals (``phi_r dphi_r f_s k_s``, ``F_AT_ZERO``,
  ``SLOPE_AT_INFINITY``, ``F2``, ``KINK``) come from :mod:`bandcore.derive.codegen.kernel_functions`.
* **numba**: a generated module — the source of :mod:`.solvers` and :mod:`.lookup` with ``xp`` bound to
  :mod:`.numba_fast_ops` (exp/log written out, every select computed, so LLVM vectorises them), the
  divergence's functions as select-form code, every function force-inlined at LLVM level (cheap to compile,
  unlike Numba's IR inlining), and drivers (:mod:`.drivers`) that solve blocks of ``BLOCK`` tokens: the
  seeds (table gathers) in one loop, the branch-free pass in a second, vectorised one, then the refined pass
  and the safeguarded solver for the tokens that pass left (:data:`.solvers.common.POLISHED`,
  ``REFINED``, ``ENTRY_POINTS``).  The drivers read the input in its own dtype, clamp (0, tol]
  to 0, count values above, and write the (optionally exponentiated) bounds in the output dtype.  The module
  is written once to the cache directory (``$BANDCORE_CACHE`` or ``~/.cache/bandcore``, named by a hash of
  its code), so Numba caches the machine code on disk.

Which solver: KL by its generator (any spelling of −log u + c(u − 1)), TV and Pearson likewise, every other
divergence the generic safeguarded Newton.  Only the generic solver needs SymPy (its functions are generated
from the generator), so KL, TV and Pearson load no SymPy on any backend.
"""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache
from types import ModuleType
from typing import Any

import numpy as np

from ..divergences import Divergence, resolve
from . import lookup, solvers
from .binding import instance, load_generated
from .drivers import SERIAL_MAX, numba_source
from .grid import KernelBound
from .lookup_drivers import lookup_module
from .seeds import NO_SEED, seed_table

__all__ = ["can_select", "has_ratio_form", "lower_at_one", "numba_module", "run_lookup", "run_lookup_torch",
           "run_numba", "seed", "solve_arrays", "solve_ratio_arrays", "solver_kind", "solver_module", "torch_seed"]

_NORMALISED = {"kl": "-log(u)", "tv": "abs(u - 1)/2", "pearson": "(u - 1)**2"}


@lru_cache(maxsize=256)
def solver_kind(divergence: Divergence) -> str:
    """"kl", "tv", "pearson" (dedicated solvers) or "generic"."""
    if divergence.name in _NORMALISED and divergence.is_catalogue:
        return divergence.name
    if divergence.name.startswith("alpha(") and divergence.is_catalogue:
        return "kl" if divergence.params == (("alpha", 0.0),) else "generic"
    from ..derive.generator_facts.mpmath_g import checked_facts  # a user formula: compare normalised generators exactly

    mine = checked_facts(divergence).f_normalised
    for kind in _NORMALISED:
        if (mine - checked_facts(resolve(kind)).f_normalised).equals(0):
            return kind
    return "generic"


def _constants(divergence: Divergence) -> dict[str, float]:
    from ..derive.codegen.kernel_functions import generator_functions

    gf = generator_functions(divergence)
    return {"F_AT_ZERO": gf.f_at_zero, "SLOPE_AT_INFINITY": gf.slope_at_infinity, "F2": gf.f2, "KINK": gf.kink}


def _instance(backend: str, tag: str = "") -> ModuleType:
    """A :mod:`.solvers` instance for ``backend`` with the table lookup its seeds are read with."""
    module = instance(solvers, backend, tag)
    module.interpolate = instance(lookup, backend).interpolate
    return module


#: The NumPy instance of the solvers (the closed forms and KL need no per-divergence binding).
_reference = _instance("numpy")


@lru_cache(maxsize=128)
def solver_module(backend: str, divergence: Divergence, kind: str | None = None) -> ModuleType:
    """A :mod:`.solvers` instance for ``backend`` ("numpy" or "torch") and ``divergence`` (cached per pair).

    ``kind="generic"`` forces the generic solver (the tests run it on KL, TV and Pearson too).
    """
    kind = kind or solver_kind(divergence)
    if backend == "numpy" and kind != "generic":
        return _reference
    module = _instance(backend, f"{kind}_{hashlib.sha256(divergence.formula.encode()).hexdigest()[:12]}")
    if kind == "generic":
        from ..derive.codegen.kernel_functions import side_callables

        for name, value in {**side_callables(divergence, module.xp), **_constants(divergence)}.items():
            setattr(module, name, value)
    return module


def seed(divergence: Divergence, delta: float, kind: str | None = None) -> KernelBound:
    """The seed table of ``divergence``'s solver at ``delta`` (:mod:`.seeds`; :data:`.seeds.NO_SEED` for the
    closed forms, which need none)."""
    kind = kind or solver_kind(divergence)
    if kind not in ("kl", "generic"):
        return NO_SEED
    return seed_table(solver_module("numpy", divergence, kind), kind, divergence, float(delta))


@lru_cache(maxsize=64)
def torch_seed(divergence: Divergence, delta: float, device: str, kind: str | None = None) -> tuple:
    """:func:`seed` as the torch binding reads it, on ``device`` (cached per device)."""
    return seed(divergence, delta, kind).torch_arrays(device)


def solve_arrays(module: ModuleType, kind: str, lp: Any, delta: float, at_one: float, seed: tuple, *,
                 fallback: bool = True) -> tuple:
    """(log r_lo, log r_up, status) of a 1-D NumPy array or torch tensor with ``module`` (a :func:`solver_module`).

    The seeded kinds run their branch-free polished pass (:data:`.solvers.POLISHED`) on every token, then on the
    tokens it marked NOT_CONVERGED the :data:`.solvers.common.REFINED` pass (up to ``REFINE_PASSES`` times) and
    the safeguarded solver: only those where selecting them costs no host synchronisation (NumPy, torch on the
    CPU outside ``torch.compile``), else the safeguarded solver on every token, merged by a select.
    ``fallback=False`` stops after the polished pass (the caller then solves the marked tokens itself).
    """
    solve = getattr(module, module.ENTRY_POINTS[kind])
    if kind not in module.POLISHED:
        return solve(lp, delta, at_one, seed)
    xp = module.xp
    lower, upper, status, *offsets = getattr(module, module.POLISHED[kind])(lp, delta, at_one,
                                                                            *module.seed_pair(lp, seed))  # fmt: skip
    if not fallback:
        return lower, upper, status
    redo = status == module.NOT_CONVERGED
    if can_select(lp):
        if bool(redo.any()):
            lower, upper, status = lower + 0.0, upper + 0.0, status + 0.0  # own copies, written below
            offsets = [d[redo] for d in offsets]
            lower[redo], upper[redo], status[redo] = _refined_then_solve(module, kind, lp[redo], delta, at_one, seed,
                                                                         offsets)  # fmt: skip
        return lower, upper, status
    lower_again, upper_again, status_again = solve(lp, delta, at_one, seed)
    return xp.where(redo, lower_again, lower), xp.where(redo, upper_again, upper), xp.where(redo, status_again, status)


def has_ratio_form(divergence: Divergence) -> bool:
    """Whether ``divergence``'s solver computes ratio bounds directly (:data:`.solvers.common.RATIO_ENTRY_POINTS`)
    rather than as exp of its log bounds."""
    return solver_kind(divergence) in solvers.common.RATIO_ENTRY_POINTS


def solve_ratio_arrays(module: ModuleType, kind: str, lp: Any, delta: float, at_one: float, seed: tuple) -> tuple:
    """(r_lo, r_up, status) as :func:`solve_arrays`: the ratios themselves for the kinds that have a ratio form
    (:data:`.solvers.common.RATIO_ENTRY_POINTS`), else exp of the log bounds."""
    if kind in module.RATIO_ENTRY_POINTS:
        return getattr(module, module.RATIO_ENTRY_POINTS[kind])(lp, delta, at_one, seed)
    lower, upper, status = solve_arrays(module, kind, lp, delta, at_one, seed)
    return module.xp.exp(lower), module.xp.exp(upper), status


def _refined_then_solve(module: ModuleType, kind: str, lp: Any, delta: float, at_one: float, seed: tuple,
                        offsets: list) -> tuple:
    """The :data:`.solvers.common.REFINED` pass of ``kind`` (if any) from the polished pass's next ``offsets``,
    again on what each pass left (up to ``REFINE_PASSES`` passes), then the safeguarded solver on the rest; for
    the tokens the polished pass left (selected: NumPy or CPU tensors)."""
    solve = getattr(module, module.ENTRY_POINTS[kind])
    if kind not in module.REFINED:
        return solve(lp, delta, at_one, seed)
    refined = getattr(module, module.REFINED[kind])
    lower, upper, status, d_up, d_lo = refined(lp, delta, at_one, *offsets)
    left = status == module.NOT_CONVERGED
    for _ in range(module.REFINE_PASSES - 1):
        if not bool(left.any()):
            return lower, upper, status
        lower[left], upper[left], status[left], d_up[left], d_lo[left] = refined(lp[left], delta, at_one,
                                                                                 d_up[left], d_lo[left])  # fmt: skip
        left = status == module.NOT_CONVERGED
    if bool(left.any()):
        lower[left], upper[left], status[left] = solve(lp[left], delta, at_one, seed)
    return lower, upper, status


def can_select(array: Any) -> bool:
    """Whether selecting elements of ``array`` by a mask costs no host synchronisation: a NumPy array, or a CPU
    tensor outside ``torch.compile``."""
    return isinstance(array, np.ndarray) or (array.device.type == "cpu" and not _compiling())


def _compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


@lru_cache(maxsize=512)
def lower_at_one(divergence: Divergence, delta: float) -> float:
    r"""log r_lo at p = 1 (perspective convention :math:`0\cdot\tilde f(x/0) = x\sigma_\infty`).

    The root of :math:`\tilde f(s) + (1-s)\sigma_\infty = \delta`, solved with the generic solver's own
    step in :math:`w = -\log s`; ``-inf`` when it saturates, 0 when :math:`\sigma_\infty = \infty`.
    """
    kind = solver_kind(divergence)
    if kind == "kl":
        return -delta
    if kind == "tv":  # r_lo(1) = 1 - delta
        return math.log1p(-delta) if delta < 1 else -math.inf
    if kind == "pearson":  # sigma_inf = inf: no mass can leave the token
        return 0.0
    module = solver_module("numpy", divergence, "generic")
    sigma, f0, f2, kink = module.SLOPE_AT_INFINITY, module.F_AT_ZERO, module.F2, module.KINK
    if not math.isfinite(sigma):
        return 0.0
    if f0 + sigma <= delta:
        return -math.inf
    w = np.array(math.sqrt(2.0 * delta / f2) if f2 > 0 else delta / max(kink, 1.0))
    lo, hi, w_prev, g_prev = np.array(0.0), np.array(1e308), np.array(math.nan), np.array(math.nan)
    with np.errstate(all="ignore"):
        for _ in range(module.MAX_ITERATIONS):
            x, log_s = np.expm1(-w), -w
            s = np.exp(log_s)
            g = module.f_s(x, log_s, s) - x * sigma
            slope = -module.k_s(x, log_s, s) + s * sigma
            candidate, lo, hi, converged = module.step(g, slope, w, lo, hi, w_prev, g_prev, delta)
            w_prev, g_prev, w = w, g, candidate
            if converged:
                break
    return -float(w)


# ------------------------------------------------------------------------------------------------------------
# Numba: the generated module
# ------------------------------------------------------------------------------------------------------------


def _numba_source(divergence: Divergence, kind: str) -> str:
    extra = []
    if kind == "generic":
        from ..derive.codegen.kernel_functions import generator_functions

        gf = generator_functions(divergence)
        extra += [f"{name} = {_literal(value)}" for name, value in _constants(divergence).items()]
        for fn in gf.functions:
            extra += ["@njit(cache=True, fastmath=FASTMATH, error_model='numpy', forceinline=True)", fn.math_source()]
    return numba_source(kind, extra)


def _literal(value: float) -> str:
    return "math.inf" if value == math.inf else repr(float(value))


@lru_cache(maxsize=64)
def numba_module(divergence: Divergence, kind: str | None = None) -> ModuleType:
    """The generated, compiled module of ``divergence`` (cached per divergence; machine code cached on disk).

    Its ``band_kernel_log(old_log_prob, delta, lower_at_one, lower, upper, status, seed)`` runs the solver of
    ``kind`` (default :func:`solver_kind`) and stores log bounds; ``band_kernel_ratio`` the ratios; both with a
    ``_serial`` twin.
    """
    kind = kind or solver_kind(divergence)
    return load_generated(_numba_source(divergence, kind), f"bandcore_numba_{kind}")


@lru_cache(maxsize=256)
def _numba_call(divergence: Divergence, delta: float, ratios: bool) -> tuple[tuple[Any, Any], float, tuple]:
    """What a :func:`run_numba` call passes besides the arrays, made once per (divergence, δ, output): the
    (parallel, serial) kernels, log r_lo at p = 1 and the seed table's arrays (read-only in the kernels)."""
    module = numba_module(divergence)
    name = "band_kernel_ratio" if ratios else "band_kernel_log"
    kernels = (getattr(module, name), getattr(module, name + "_serial"))
    return kernels, lower_at_one(divergence, delta), seed(divergence, delta).arrays()


def run_numba(divergence: Divergence, old_log_prob: np.ndarray, delta: float, *, ratios: bool = False,
              out_dtype: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(lower, upper, status, n_above) for a float32/float64 array in one parallel pass (see the module doc)."""
    flat = np.ascontiguousarray(old_log_prob).reshape(-1)
    dtype = flat.dtype if out_dtype is None else np.dtype(out_dtype)
    lower = np.empty(flat.shape, dtype=dtype)
    upper = np.empty(flat.shape, dtype=dtype)
    status = np.empty(flat.shape, dtype=np.int8)
    kernels, at_one, seed_arrays = _numba_call(divergence, float(delta), ratios)
    above = kernels[flat.size <= SERIAL_MAX](flat, float(delta), at_one, lower, upper, status, seed_arrays)
    shape = np.shape(old_log_prob)
    return lower.reshape(shape), upper.reshape(shape), status.reshape(shape), int(above)


# ------------------------------------------------------------------------------------------------------------
# Lookup tables: the one evaluation source (:mod:`.lookup`) on every backend
# ------------------------------------------------------------------------------------------------------------

def run_lookup(log_p: np.ndarray, lower: KernelBound, upper: KernelBound, out_dtype: Any, tol: float,
               backend: str = "numba", ratios: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """(log r_lo, log r_up, count of log p > tol) of a table for a flat float32/float64 array; with ``ratios``
    (r_lo, r_up), exp of the log bounds rounded once to ``out_dtype`` (in the Numba kernel's last loop).

    ``backend="numba"``: one parallel pass reading the input in its own dtype (besides the outputs, one small
    buffer per run of blocks; :mod:`.drivers`); ``"numpy"``: the same source vectorised (imports no Numba).
    Above ``tol`` the bounds are NaN.
    """
    if backend == "numba":
        out_lo = np.empty(log_p.shape, dtype=out_dtype)
        out_up = np.empty(log_p.shape, dtype=out_dtype)
        module = lookup_module()
        kernel = module.table_kernel if log_p.size > SERIAL_MAX else module.table_kernel_serial
        above = kernel(log_p, lower.arrays(), upper.arrays(), tol, ratios, out_lo, out_up)
        return out_lo, out_up, int(above)
    lp = log_p.astype(np.float64, copy=False)
    with np.errstate(all="ignore"):  # (also the cast: a bound beyond float32's range is its ±inf)
        lo, up = instance(lookup, "numpy").table_bounds(lp, lower.numpy_arrays(), upper.numpy_arrays(), tol)
        lo, up = (np.exp(lo), np.exp(up)) if ratios else (lo, up)
        return lo.astype(out_dtype, copy=False), up.astype(out_dtype, copy=False), int(np.count_nonzero(lp > tol))


def run_lookup_torch(log_p, lower: tuple, upper: tuple, tol: float):
    """(log r_lo, log r_up) in float64 for a float64 tensor, from :meth:`KernelBound.torch_arrays`; no host
    synchronisation, so log p above ``tol`` gives NaN instead of an error."""
    return instance(lookup, "torch").table_bounds(log_p, lower, upper, tol)

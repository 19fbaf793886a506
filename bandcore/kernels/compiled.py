r"""The solvers compiled by Numba: a plan's generated module (:func:`numba_module`) and its bound call
(:class:`CompiledSolver`).

The module is the source of :mod:`.lookup` and of the parts of :mod:`.solvers` with ``xp`` bound to
:mod:`.numba_fast_ops` (:func:`.sources.generated_source`), a generic plan's constants and select-form functions
in place of the generator part, and the drivers of :mod:`.drivers`; it lives in the cache (:mod:`bandcore._cache`),
Numba's machine code of it in that folder's ``__pycache__``.  Its first call per signature is guarded against
damaged Numba files and marks the signature ready (:func:`.sources.call_generated`).
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from ..plan import SolverPlan
from . import solvers, sources
from .drivers import SERIAL_MAX, numba_source

__all__ = ["CompiledSolver", "is_ready", "module_name", "numba_module", "plan_source"]


def plan_source(plan: SolverPlan) -> str:
    """The generated module's source for ``plan``: its kind's drivers, with a generic plan's constants and
    functions."""
    extra = []
    if plan.kind == "generic":
        extra += [f"{name} = {_literal(value)}" for name, value in solvers.constants(plan).items()]
        for fn in plan.functions:
            extra += ["@njit(cache=True, fastmath=FASTMATH, error_model='numpy', forceinline=True)", fn.select_source]
    return numba_source(plan.kind, extra)


def _literal(value: float) -> str:
    return "math.inf" if value == math.inf else repr(float(value))


def _prefix(plan: SolverPlan) -> str:
    return f"bandcore_numba_{plan.kind}"


def numba_module(plan: SolverPlan) -> ModuleType:
    """The generated, compiled module of ``plan`` (one per process; machine code cached on disk).

    Its ``band_kernel_log(old_log_prob, delta, lower_at_one, lower, upper, status, seed)`` runs the plan's solver
    and stores log bounds; ``band_kernel_ratio`` the ratios; both with a ``_serial`` twin.
    """
    return sources.load_generated(plan_source(plan), _prefix(plan))


def module_name(plan: SolverPlan) -> str:
    """The generated module's name (and file stem) for ``plan``."""
    return sources.generated_name(plan_source(plan), _prefix(plan))


def signature(ratios: bool, dtype: Any, out_dtype: Any, size: int) -> str:
    """The kernel a call runs: ratios or logs, input and output dtypes, serial or parallel driver."""
    driver = "serial" if size <= SERIAL_MAX else "parallel"
    return f"{'ratio' if ratios else 'log'}-{np.dtype(dtype).name}-{np.dtype(out_dtype).name}-{driver}"


def is_ready(name: str, ratios: bool, dtype: Any, size: int) -> bool:
    """Whether the kernel of the module ``name`` (:func:`module_name`) for this output, input dtype (and output
    dtype) and size runs without a compile (:func:`.sources.is_ready`)."""
    return sources.is_ready(name, signature(ratios, dtype, dtype, size))


class CompiledSolver:
    """The compiled solver of a plan at one δ: ``solver(flat) -> (lower, upper, status, n_above)`` for a
    contiguous 1-D float32/float64 array, in one parallel pass (serially up to :data:`.drivers.SERIAL_MAX` tokens;
    :mod:`.drivers`): (0, TOL] read as 0, the count of inputs above TOL returned, bounds in ``out_dtype`` (default:
    the input's)."""

    def __init__(self, plan: SolverPlan, delta: float, ratios: bool, at_one: float, seed: tuple) -> None:
        self.plan, self.delta, self.ratios, self.at_one, self.seed = plan, float(delta), ratios, at_one, seed
        if plan.kind in solvers.common.POLISHED and np.any(seed[3] != seed[3][0]):
            raise ValueError("a seed table for the Numba kernels must have one level in every octave (.seeds)")
        self._source = plan_source(plan)
        self.module = sources.load_generated(self._source, _prefix(plan))
        self._name = "band_kernel_ratio" if ratios else "band_kernel_log"
        #: (dtype, out dtype, serial) -> the kernel, once its first call went through
        self._checked: dict[tuple, Any] = {}

    def __call__(self, flat: np.ndarray, out_dtype: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        dtype = flat.dtype if out_dtype is None else np.dtype(out_dtype)
        lower = np.empty(flat.shape, dtype=dtype)
        upper = np.empty(flat.shape, dtype=dtype)
        status = np.empty(flat.shape, dtype=np.int8)
        serial = flat.size <= SERIAL_MAX
        kernel = self._checked.get((flat.dtype, dtype, serial))
        if kernel is not None:
            above = kernel(flat, self.delta, self.at_one, lower, upper, status, self.seed)
        else:
            above = self._first_call(flat, dtype, serial, lower, upper, status)
        return lower, upper, status, int(above)

    def _first_call(self, flat, dtype, serial: bool, lower, upper, status) -> int:
        """The first call of a kernel: the module as loaded now (another solver may have rebuilt it), the call
        guarded (:func:`.sources.call_generated`)."""
        name = self._name + "_serial" if serial else self._name

        def call(module: ModuleType) -> int:
            return getattr(module, name)(flat, self.delta, self.at_one, lower, upper, status, self.seed)

        module = sources.load_generated(self._source, _prefix(self.plan))
        kernel = signature(self.ratios, flat.dtype, dtype, flat.size)
        self.module, above = sources.call_generated(module, self._source, _prefix(self.plan), kernel, call)
        self._checked[(flat.dtype, dtype, serial)] = getattr(self.module, name)
        return above

r"""Evaluating a table: the octave-cell lookup of :mod:`bandcore.kernels.lookup` (written once, bound to
NumPy, Numba and torch by :mod:`bandcore.kernels.backends`), and the grid it reads
(:mod:`bandcore.kernels.grid`).  See :mod:`bandcore.kernels.lookup` for the cells and the stored functions."""

from __future__ import annotations

import numpy as np

from ..kernels.grid import MAX_LEVEL, KernelBound, cell_offsets, octave_grid, octave_of, pack
from ..kernels.lookup_drivers import run_lookup, run_lookup_torch

__all__ = ["MAX_LEVEL", "KernelBound", "cell_offsets", "eval_log", "eval_log_numba", "eval_log_torch", "octave_grid",
           "octave_of", "pack", "torch_arrays"]


def eval_log(log_p: np.ndarray, lower: KernelBound, upper: KernelBound, out_dtype, tol: float,
             backend: str = "numba", ratios: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """(log r_lo, log r_up, count of log p > tol) for a flat float32/float64 array, computed in float64 on
    ``backend`` ("numba" or "numpy"); with ``ratios``, (r_lo, r_up) (computed in float64, rounded once)."""
    return run_lookup(log_p, lower, upper, out_dtype, tol, backend, ratios)


def eval_log_numba(log_p: np.ndarray, lower: KernelBound, upper: KernelBound, out_dtype, tol: float):
    """:func:`eval_log` on the Numba backend (one parallel pass, reading the input in its own dtype)."""
    return run_lookup(log_p, lower, upper, out_dtype, tol, "numba")


def torch_arrays(bound: KernelBound, device) -> tuple:
    """The bound's arrays for the torch binding, on ``device`` (cached by the caller)."""
    return bound.torch_arrays(device)


def eval_log_torch(log_p, lower_arrays, upper_arrays, tol: float):
    """(log r_lo, log r_up) in float64 for a float64 tensor; no host synchronisation, so log p > ``tol``
    gives NaN instead of an error."""
    return run_lookup_torch(log_p, lower_arrays, upper_arrays, tol)

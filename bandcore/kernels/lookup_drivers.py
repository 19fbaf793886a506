r"""The certified tables' lookup run on arrays (:func:`run_lookup`, :func:`run_lookup_torch`): the one evaluation
source (:mod:`.lookup`) bound to NumPy or torch, or compiled with the Numba driver (:func:`lookup_module`) whose
templates of the generated module's loops are here, built like the solver drivers (:mod:`.drivers`)."""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType
from typing import Any

import numpy as np

from . import lookup
from .drivers import SERIAL_MAX, by_value_source, serial_and_parallel
from .grid import KernelBound
from .ops import numpy_ops, torch_ops
from .slots import KINDS, SPLIT_LOWER
from .sources import call_generated, generated_name, generated_source, is_ready, load_generated, vectorised_module

__all__ = ["CHUNKS", "TABLE_BLOCK", "lookup_module", "lookup_ready", "run_lookup", "run_lookup_torch"]
# The table kernel (:func:`lookup_module`) runs :mod:`.lookup`'s steps (its docstring) with the fast ops
# (:mod:`.numba_fast_ops`) and every select computed: per run of blocks (one buffer allocation), per block of
# BLOCK tokens, per bound, a vectorised loop for the cells' variables and octaves, a scalar loop for the gathers,
# a vectorised loop per kind (chosen once per block) for the transform, then the few pending tokens (two to four
# times faster than one loop with libm: ``docs/kernel_measurements.md``).

#: One bound on a block of tokens, in three loops: the variable of each token's cell and its octave
#: (vectorised); the cells' gathers (a scalar loop: LLVM does not vectorise gathers; unsigned indices, so that
#: Numba adds no negative-index wraparound); the ends and the bound's transform with the fast ops, branch-free
#: (vectorised), flagging the tokens it leaves pending (:func:`.lookup.bound_cheap`, tails), which
#: :data:`_TABLE_PENDING` finishes.  Split in three, the scalar loop's dependency chain is short, so consecutive
#: tokens' gathers overlap.  The loops that depend on the kind are inlined once per kind under a branch on it
#: (KINDS), so that LLVM folds every test of the kind inside them and vectorises each; Numba compiles them once.
#: With ``ratios`` a split lower bound's pass gives its ratios (``direct``, returned), any other bound log r.
_TABLE_BOUND = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def table_bound(Ls, bound, x, o, inner, out, ratios):
    fm, im, off, shift, cells = bound
    if im[KIND] >= SPLIT_LOWER:
        table_octaves(Ls, fm, im, off.shape[0], x, o)
    else:
        table_octaves(Ls, fm, im, off.shape[0], x, o)
    for j in range(Ls.size):
        c = cell_in(x[j], np.uint64(o[j]), off, shift, cells.shape[0])
        inner[j] = cubic(x[j], cells, np.uint64(c))
    pending = 0
    direct = False
KINDS
    if pending:
        table_pending(Ls, fm, im, x, o, inner, out, direct)
    return direct


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", forceinline=True)
def table_octaves(Ls, fm, im, n_octaves, x, o):
    for j in range(Ls.size):
        xj, e_a, first = part_grid(Ls[j], fm, im)
        x[j] = xj
        o[j] = octave_entry(xj, e_a, first, n_octaves)


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", forceinline=True)
def table_finish(Ls, fm, im, inner, o, out):
    pending = 0
    for j in range(Ls.size):
        y, later = bound_cheap(Ls[j], inner[j], fm, im)
        out[j] = y
        flag = later | in_tail(Ls[j], fm, im)
        o[j] = flag
        pending += flag
    return pending


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", forceinline=True)
def table_finish_ratio(Ls, fm, im, inner, o, out):
    pending = 0
    for j in range(Ls.size):
        r, later = split_lower_ratio(Ls[j], inner[j], fm, im)
        out[j] = r
        flag = later | in_tail(Ls[j], fm, im)
        o[j] = flag
        pending += flag
    return pending
'''
#: The pending tokens of a block (flagged in ``o``): their indices packed to the front (branch-free, one store a
#: token), their L and cell values gathered after them (the few pending ones only: a third of the stores of
#: packing all three, 1.05-1.07x on js and reverse KL at 10k tokens, ``docs/kernel_measurements.md``),
#: :func:`.lookup.bound_pending` on them (vectorised; a split upper bound's near part), or with ``direct`` (a
#: split lower bound read as ratios, :func:`.lookup.split_lower_ratio`) the exp of its near part's log r, then
#: :data:`_TABLE_STORE`.
_TABLE_PENDING = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy", forceinline=True)
def table_pending(Ls, fm, im, x, o, inner, out, direct):
    k = 0
    for j in range(Ls.size):
        flag = o[j]
        o[k] = j
        k += flag
    for i in range(k):  # o[i] >= i, so inner[o[i]] is not yet overwritten
        j = np.uint64(o[i])
        x[i] = Ls[j]
        inner[i] = inner[j]
    if im[KIND] == SPLIT_UPPER:  # one loop per form of the near part: bound_pending branches on it
        if im[NEAR_POWER] == 0:
            for i in range(k):
                x[i] = bound_pending(x[i], inner[i], fm, im)
        else:
            for i in range(k):
                x[i] = bound_pending(x[i], inner[i], fm, im)
    elif direct:
        for i in range(k):
            x[i] = xp.exp(split_lower(x[i], inner[i], fm, im))
    table_store(Ls, fm, im, x, o, k, out, direct)
'''
#: Stores the ``k`` pending values ``y`` (a split upper bound's, or with ``direct`` a split lower bound's ratios;
#: any other kind's are stored already) at their indices ``o``, replaced by the tail where a token lies in one (a
#: Newton solve, five logarithms: only for the tokens there; its exp with ``direct``; a bound without tails: a
#: plain scatter, 1.01-1.05x on `mid` tokens).  One function for every kind (not inlined: compiled once).
_TABLE_STORE = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def table_store(Ls, fm, im, y, o, k, out, direct):
    if im[LEFT_TAIL] != 1 and im[RIGHT_TAIL] == NO_TAIL:  # no tails: a plain scatter
        if im[KIND] == SPLIT_UPPER or direct:
            for i in range(k):
                out[np.uint64(o[i])] = y[i]
        return
    for i in range(k):
        j = np.uint64(o[i])
        L = Ls[j]
        value = y[i] if im[KIND] == SPLIT_UPPER or direct else out[j]
        if in_tail(L, fm, im):
            value = tail_log(L, xp.log(value) if direct else value, fm, im)
            value = xp.exp(value) if direct else value
        out[j] = value
'''
#: The blocks [first, last) of tokens, through views of each block (as :data:`_BLOCK`), with buffers allocated once
#: for them all (an allocation per block was measurable): the lower bound, the upper bound (sharing the
#: buffers), each stored (with ``ratios``, as its exp, unless the bound's pass gave the ratios themselves) with
#: log p above ``tol`` as NaN, then the count of those.
_TABLE_BLOCKS = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def table_blocks(log_p, first, last, lower, upper, tol, ratios, out_lo, out_up):
    floats = np.empty(4 * BLOCK)
    Ls, x, inner, y = floats[:BLOCK], floats[BLOCK:2 * BLOCK], floats[2 * BLOCK:3 * BLOCK], floats[3 * BLOCK:]
    o = np.empty(BLOCK, dtype=np.int64)
    above = 0
    for start in range(first, last, BLOCK):
        lps = log_p[start:min(start + BLOCK, last)]
        for j in range(lps.size):
            Ls[j] = minus_log_p(np.float64(lps[j]))
        direct = table_bound(Ls[:lps.size], by_value(lower), x, o, inner, y, ratios)
        table_store_block(lps, tol, ratios and not direct, y, out_lo[start:start + lps.size])
        direct = table_bound(Ls[:lps.size], by_value(upper), x, o, inner, y, ratios)
        table_store_block(lps, tol, ratios and not direct, y, out_up[start:start + lps.size])
        for j in range(lps.size):
            above += lps[j] > tol
    return above


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", forceinline=True)
def table_store_block(lps, tol, exps, y, out):
    if exps:  # two loops, so that neither computes what it does not store
        for j in range(lps.size):
            out[j] = xp.exp(y[j]) if lps[j] <= tol else np.nan
    else:
        for j in range(lps.size):
            out[j] = y[j] if lps[j] <= tol else np.nan
'''
#: The tokens cut into CHUNKS runs of whole blocks (a run per task of the parallel loop: enough for the
#: threads to balance, few enough that the buffers' allocations do not count).
_TABLE_DRIVER = '''

@njit(cache=True, parallel={parallel}, fastmath=FASTMATH, error_model="numpy")
def table_kernel{suffix}(log_p, lower, upper, tol, ratios, out_lo, out_up):
    """One pass: (log r_lo, log r_up) of a table in float64 (their exp with ``ratios``), stored in the output
    dtype; counts log p > tol."""
    n = log_p.shape[0]
    blocks = (n + BLOCK - 1) // BLOCK
    runs = min(blocks, CHUNKS)
    above = 0
    for run in {range}(runs):
        first = run * blocks // runs * BLOCK
        above += table_blocks(log_p, first, min((run + 1) * blocks // runs * BLOCK, n), lower, upper, tol, ratios,
                              out_lo, out_up)
    return above
'''
#: Runs of blocks per call of a table kernel (:data:`_TABLE_DRIVER`).
CHUNKS = 64
#: Tokens per block of the table kernel (``BLOCK`` in its source; its buffers: 40 KB).  Each block and bound
#: costs a few calls and loop remainders, so larger blocks than the solvers' pay at 10k tokens
#: (``docs/kernel_measurements.md``).
TABLE_BLOCK = 1024


def _table_drivers() -> str:
    """:data:`_TABLE_BOUND` with a branch per kind (a split lower bound's with ratios wanted: its stored r read
    as the output, :func:`.lookup.split_lower_ratio`), the block and the drivers."""
    finish = "pending = table_finish(Ls, fm, im, inner, o, out)"
    direct = ("if ratios:\n            pending = table_finish_ratio(Ls, fm, im, inner, o, out)\n"
              "            direct = True\n        else:\n            " + finish)
    kinds = "\n".join(f"    {'if' if kind == 0 else 'elif'} im[KIND] == {kind}:\n        "
                      f"{direct if kind == SPLIT_LOWER else finish}" for kind in range(KINDS))
    bound = _TABLE_BOUND.replace("KINDS\n", kinds + "\n")
    return _TABLE_STORE + _TABLE_PENDING + bound + _TABLE_BLOCKS + serial_and_parallel(_TABLE_DRIVER)


@lru_cache(maxsize=1)
def _lookup_source() -> str:
    drivers = by_value_source() + _table_drivers()
    constants = [f"BLOCK = {TABLE_BLOCK}", f"CHUNKS = {CHUNKS}"]
    return generated_source([lookup], "numba_fast_ops", constants, drivers, inline=True)


_PREFIX = "bandcore_numba_lookup"
#: (driver name, input dtype, output dtype, ratios) -> the kernel, once its first call went through the guard
#: (:func:`.sources.call_generated`): later calls skip the guard's bookkeeping (~2 us a call)
_CHECKED: dict[tuple, Any] = {}


def lookup_module() -> ModuleType:
    """The generated module of the table lookup (:data:`_TABLE_DRIVER`), with the fast ops
    (:mod:`.numba_fast_ops`) and every select computed, so that the vectorised loops vectorise."""
    return load_generated(_lookup_source(), _PREFIX)


def _driver(size: int) -> str:
    """The driver that reads ``size`` tokens: serial up to SERIAL_MAX, parallel above."""
    return "table_kernel" if size > SERIAL_MAX else "table_kernel_serial"


def _signature(size: int, dtype: Any, out_dtype: Any, ratios: bool) -> str:
    return _driver_signature(_driver(size), dtype, out_dtype, ratios)


@lru_cache(maxsize=64)
def _driver_signature(driver: str, dtype: Any, out_dtype: Any, ratios: bool) -> str:
    """The signature of ``driver`` for these dtypes and output, remembered: every lookup asks for it
    (``docs/kernel_measurements.md``)."""
    return f"{driver}-{np.dtype(dtype).name}-{np.dtype(out_dtype).name}-{ratios}"


def lookup_ready(size: int, dtype: Any, out_dtype: Any, ratios: bool) -> bool:
    """Whether :func:`run_lookup` on Numba runs without a compile for ``size`` tokens of ``dtype`` (its serial or
    parallel driver, this output): the kernel ran in this process, or its machine code is in the cache on disk
    (:func:`.sources.is_ready`).  Imports no Numba."""
    return is_ready(_lookup_name(), _signature(size, dtype, out_dtype, ratios))


@lru_cache(maxsize=1)
def _lookup_name() -> str:
    return generated_name(_lookup_source(), _PREFIX)


def _vectorised(backend: str) -> ModuleType:
    xp = numpy_ops if backend == "numpy" else torch_ops()
    return vectorised_module((lookup,), xp, f"bandcore.kernels.lookup_{backend}", {})


def run_lookup(log_p: np.ndarray, lower: KernelBound, upper: KernelBound, out_dtype: Any, tol: float,
               backend: str = "numba", ratios: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """(log r_lo, log r_up, count of log p > tol) of a table for a flat float32/float64 array; with ``ratios``
    (r_lo, r_up) computed in float64 and rounded once to ``out_dtype``: exp of the log bounds (in the Numba
    kernel's last loop), where a split lower bound's far part stores r, that r itself (Numba kernel).

    ``backend="numba"``: one parallel pass reading the input in its own dtype (besides the outputs, one small
    buffer per run of blocks; :mod:`.drivers`; its first call per signature guarded against damaged Numba files,
    :func:`.sources.call_generated`); ``"numpy"``: the same source vectorised (imports no Numba).  Above ``tol``
    the bounds are NaN.
    """
    if backend == "numba":
        out_lo = np.empty(log_p.shape, dtype=out_dtype)
        out_up = np.empty(log_p.shape, dtype=out_dtype)
        name = _driver(log_p.size)
        key = (name, log_p.dtype, out_lo.dtype, ratios)
        kernel = _CHECKED.get(key)
        if kernel is not None:
            return out_lo, out_up, int(kernel(log_p, lower.arrays(), upper.arrays(), tol, ratios, out_lo, out_up))

        def call(module: ModuleType) -> int:
            return getattr(module, name)(log_p, lower.arrays(), upper.arrays(), tol, ratios, out_lo, out_up)

        signature = _signature(log_p.size, log_p.dtype, out_dtype, ratios)
        module, above = call_generated(lookup_module(), _lookup_source(), _PREFIX, signature, call)
        _CHECKED[key] = getattr(module, name)
        return out_lo, out_up, int(above)
    lp = log_p.astype(np.float64, copy=False)
    with np.errstate(all="ignore"):  # (also the cast: a bound beyond float32's range is its ±inf)
        lo, up = _vectorised("numpy").table_bounds(lp, lower.numpy_arrays(), upper.numpy_arrays(), tol)
        lo, up = (np.exp(lo), np.exp(up)) if ratios else (lo, up)
        return lo.astype(out_dtype, copy=False), up.astype(out_dtype, copy=False), int(np.count_nonzero(lp > tol))


def run_lookup_torch(log_p, lower: tuple, upper: tuple, tol: float):
    """(log r_lo, log r_up) in float64 for a float64 tensor, from :meth:`KernelBound.torch_arrays`; no host
    synchronisation, so log p above ``tol`` gives NaN instead of an error."""
    return _vectorised("torch").table_bounds(log_p, lower, upper, tol)

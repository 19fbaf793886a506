r"""The Numba driver of the certified tables' lookup (:func:`lookup_module`): templates of the generated module's
loops around the one evaluation source (:mod:`.lookup`), built like the solver drivers (:mod:`.drivers`)."""

from __future__ import annotations

from functools import lru_cache
from types import ModuleType

from . import lookup
from .binding import generated_source, load_generated
from .drivers import by_value_source, serial_and_parallel
from .slots import KINDS

__all__ = ["CHUNKS", "TABLE_BLOCK", "lookup_module"]
# The table kernel (:func:`lookup_module`) runs :mod:`.lookup`'s steps (its docstring) with the fast ops
# (:mod:`.numba_fast_ops`) and every select computed: per run of blocks (one buffer allocation), per block of
# BLOCK tokens, per bound, a vectorised loop for the cells' variables and octaves, a scalar loop for the gathers,
# a vectorised loop per kind (chosen once per block) for the transform, then the few pending tokens.  Measured
# (wall ns/token for both bounds, 1 thread, 500k / 10k float32 tokens of the llm and mid inputs, medians of 7
# interleaved rounds against the previous one-loop kernel with libm, on a shared 2-core machine):
# kl 12/8.4 (was 28/20), neyman 10-12/8.7 (20/12), tv 12/9.2 (43-48/24), hellinger 12-18/11 (47-49/25),
# js 18-19/11-12 (65-78/42-48), reverse_kl 19/12 (70-76/44-48); a copy pass (read float32, write two float32)
# 0.2 ns/token.  In-process CPU time, 500k: kl 7.2, neyman 6.0, tv 8.1, hellinger 8.1, js 9.4-11.1,
# reverse_kl 10.4-10.8.  ``python scripts/ab_lookup.py <main tree> . --reps 7 --sizes 500000 10000 --copy``

#: One bound on a block of tokens, in three loops: the variable of each token's cell and its octave
#: (vectorised); the cells' gathers (a scalar loop: LLVM does not vectorise gathers; unsigned indices, so that
#: Numba adds no negative-index wraparound); the ends and the bound's transform with the fast ops, branch-free
#: (vectorised), flagging the tokens it leaves pending (:func:`.lookup.bound_cheap`, tails), which
#: :data:`_TABLE_PENDING` finishes.  Split in three, the scalar loop's dependency chain is short, so consecutive
#: tokens' gathers overlap.  The loops that depend on the kind are inlined once per kind under a branch on it
#: (KINDS), so that LLVM folds every test of the kind inside them and vectorises each; Numba compiles them once.
_TABLE_BOUND = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def table_bound(Ls, bound, x, o, inner, out):
    fm, im, off, shift, cells = bound
    if im[KIND] >= SPLIT_LOWER:
        table_octaves(Ls, fm, im, off.shape[0], x, o)
    else:
        table_octaves(Ls, fm, im, off.shape[0], x, o)
    for j in range(Ls.size):
        c = cell_in(x[j], np.uint64(o[j]), off, shift, cells.shape[0])
        inner[j] = cubic(x[j], cells, np.uint64(c))
    pending = 0
KINDS
    if pending:
        table_pending(Ls, fm, im, x, o, inner, out)


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
'''
#: The pending tokens of a block (flagged in ``o``): their indices, L and cell values packed to the front
#: (branch-free), :func:`.lookup.bound_pending` on them (vectorised; a split upper bound's near part only),
#: then :data:`_TABLE_STORE`.
_TABLE_PENDING = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy", forceinline=True)
def table_pending(Ls, fm, im, x, o, inner, out):
    k = 0
    for j in range(Ls.size):
        flag = o[j]
        o[k] = j
        x[k] = Ls[j]
        inner[k] = inner[j]
        k += flag
    if im[KIND] == SPLIT_UPPER:
        for i in range(k):
            x[i] = bound_pending(x[i], inner[i], fm, im)
    table_store(Ls, fm, im, x, o, k, out)
'''
#: Stores the ``k`` pending values ``y`` (a split upper bound's; any other kind's are stored already) at their
#: indices ``o``, replaced by the tail where a token lies in one (a Newton solve, five logarithms: only for the
#: tokens there).  One function for every kind (not inlined: compiled once).
_TABLE_STORE = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def table_store(Ls, fm, im, y, o, k, out):
    for i in range(k):
        j = np.uint64(o[i])
        L = Ls[j]
        value = y[i] if im[KIND] == SPLIT_UPPER else out[j]
        if in_tail(L, fm, im):
            value = tail_log(L, value, fm, im)
        out[j] = value
'''
#: The blocks [first, last) of tokens, through views of each block (as :data:`_BLOCK`), with buffers allocated once
#: for them all (an allocation per block cost ~0.5 ns/token): the lower bound, the upper bound (sharing the
#: buffers), each stored (as its exp with ``ratios``: ratio bounds) with log p above ``tol`` as NaN, then the
#: count of those.
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
        table_bound(Ls[:lps.size], by_value(lower), x, o, inner, y)
        table_store_block(lps, tol, ratios, y, out_lo[start:start + lps.size])
        table_bound(Ls[:lps.size], by_value(upper), x, o, inner, y)
        table_store_block(lps, tol, ratios, y, out_up[start:start + lps.size])
        for j in range(lps.size):
            above += lps[j] > tol
    return above


@njit(cache=True, fastmath=FASTMATH, error_model="numpy", forceinline=True)
def table_store_block(lps, tol, ratios, y, out):
    if ratios:  # two loops, so that neither computes what it does not store
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
#: costs a few calls and loop remainders, so larger blocks than the solvers' pay at 10k tokens: 1 thread, CPU
#: time of ``log()``, median of 7 interleaved rounds (``scripts/ab_lookup.py``), 256 -> 1024: js 12.0 -> 10.5
#: ns/token on 10k mid tokens, reverse_kl 11.5 -> 10.2, kl 8.0 -> 7.6; at 500k js 10.8 -> 10.1, kl 6.7 -> 6.9;
#: 1024 against 512: 1.03-1.08x at 10k.
TABLE_BLOCK = 1024


def _table_drivers() -> str:
    """:data:`_TABLE_BOUND` with a branch per kind, the block and the drivers."""
    branch = "    {} im[KIND] == {}:\n        pending = table_finish(Ls, fm, im, inner, o, out)"
    kinds = "\n".join(branch.format("if" if kind == 0 else "elif", kind) for kind in range(KINDS))
    bound = _TABLE_BOUND.replace("KINDS\n", kinds + "\n")
    return _TABLE_STORE + _TABLE_PENDING + bound + _TABLE_BLOCKS + serial_and_parallel(_TABLE_DRIVER)


@lru_cache(maxsize=1)
def lookup_module() -> ModuleType:
    """The generated module of the table lookup (:data:`_TABLE_DRIVER`), with the fast ops
    (:mod:`.numba_fast_ops`) and every select computed, so that the vectorised loops vectorise."""
    drivers = by_value_source() + _table_drivers()
    constants = [f"BLOCK = {TABLE_BLOCK}", f"CHUNKS = {CHUNKS}"]
    source = generated_source([(lookup, False)], "numba_fast_ops", constants, drivers, inline=True)
    return load_generated(source, "bandcore_numba_lookup")

r"""The Numba drivers: templates of the generated module's loops around the one solver source (:mod:`.solvers`),
and the generated source itself (:func:`numba_source`; the table lookup's are in :mod:`.lookup_drivers`).
:mod:`.compiled` compiles and calls them.

A driver cuts the tokens into blocks of :data:`BLOCK` and runs the blocks in parallel (serially up to
:data:`SERIAL_MAX` tokens): the closed forms in one branch-free loop; the seeded kinds gather their seeds in one
loop and run the polished pass (:data:`.solvers.common.POLISHED`) in a vectorised one.  Where the kind has a
refined pass (:data:`.solvers.common.REFINED`), the block then compacts the tokens the polished pass marked
NOT_CONVERGED and runs it on them in a vectorised loop (:data:`_REFINE_FUNCTION`), up to ``REFINE_PASSES``
times; the driver's last loop runs the safeguarded solver (:data:`.solvers.common.ENTRY_POINTS`) on what is
still NOT_CONVERGED (vectorised in the block, the refined pass costs a fraction of what it cost per token in
the last loop).  The measurements behind these choices and the constants below are in ``docs/kernel_measurements.md``.
"""

from __future__ import annotations

import textwrap

from .._contract import LOG_P_TOLERANCE
from . import lookup, solvers
from .slots import FM_SIZE, IM_SIZE
from .solvers import common as _registry
from .sources import generated_source

__all__ = ["BLOCK", "OUTPUTS", "SERIAL_MAX", "by_value_source", "numba_source", "serial_and_parallel"]

#: Solve one token (log p in ``lp``) with SOLVER(..., ARGS) and store OUT(bounds) at INDEX of the arrays LOWER,
#: UPPER, STATUS (one body for every pass of the drivers).
_TOKEN = '''lo, up, st = SOLVER(lp, delta, lower_at_one, ARGS)
LOWER[INDEX] = OUT(lo)
UPPER[INDEX] = OUT(up)
STATUS[INDEX] = np.int8(st)'''
#: One block of tokens [first, last), read and written through views of the block (indices from 0, which LLVM
#: knows to be non-negative: indexing ``array[first + j]`` keeps Numba's negative-index wraparound in the loop,
#: which then does not vectorise): the closed forms in one branch-free loop; the seeded solvers with p, 1 - p,
#: the L of both roots (-log p, -log(1 - p)) and their seed cells in a vectorised loop, the cells' coefficients
#: (table gathers, which LLVM does not vectorise) in a second and the branch-free polished pass in a third,
#: vectorised one.  Returns how many inputs are above TOL.  A function of its own, called by both drivers:
#: Numba's parallel passes never see its body.
_BLOCK = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def solve_block{output}(old_log_prob, first, last, delta, lower_at_one, lower, upper, status, seed):
    log_p = old_log_prob[first:last]
    lo_out = lower[first:last]
    up_out = upper[first:last]
    st_out = status[first:last]
{seeds}
    for j in range(log_p.size):
        lp = {read}
{solve}
    above = 0
    for j in range(log_p.size):  # a loop of its own: in the one above, the count would slow it down by a third
        above += log_p[j] > TOL
    return above
'''
_CLAMPED = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy", forceinline=True)
def clamped(value):
    """log p as float64, with (0, TOL] clamped to 0."""
    lp = np.float64(value)
    return 0.0 if lp > 0.0 and lp <= TOL else lp
'''
#: What every seeded block reads of its seed table (:data:`_SEED_CELL`'s constants, the cells' coefficients flat)
_SEED_TABLE = '''    seed = by_value(seed)
    level_shift = seed[3][0]  # every seed table has one level in all its octaves, and starts on an octave
    base = ((1023 + seed[1][OCTAVE_A]) << (52 - level_shift)) - seed[2][0]
    n_cells = seed[4].shape[0]
    cells = seed[4].reshape(-1)
'''
_SEEDS = _SEED_TABLE + '''    w_up = np.empty(BLOCK)
    w_lo = np.empty(BLOCK)
    known = np.empty((5, BLOCK))  # log(1 - p), p, 1 - p: the polished pass takes them rather than computing them
    lq, p, pc, s_up, s_lo = known[0], known[1], known[2], known[3], known[4]
    cell = np.empty((2, BLOCK), dtype=np.int64)
    c_up, c_lo = cell[0], cell[1]
    for j in range(log_p.size):  # vectorised: -log p and -log(1 - p), where the seeds are read, and their cells
        lps, lq[j], p[j], pc[j] = regular_point(clamped(log_p[j]))
        w_up[j] = -lps
        w_lo[j] = -lq[j]
        c_up[j], s_up[j] = seed_cell_of(w_up[j], level_shift, base, n_cells)
        c_lo[j], s_lo[j] = seed_cell_of(w_lo[j], level_shift, base, n_cells)
    for j in range(log_p.size):  # the gathers: each cell's cubic at s (seed_start finishes it, vectorised)
        c = 6 * c_up[j]
        s = s_up[j]
        s_up[j] = cells[c + 2] + s * (cells[c + 3] + s * (cells[c + 4] + s * cells[c + 5]))
        c = 6 * c_lo[j]
        s = s_lo[j]
        s_lo[j] = cells[c + 2] + s * (cells[c + 3] + s * (cells[c + 4] + s * cells[c + 5]))'''
#: KL's seed loops (:func:`.solvers.common.kl_seed_pair`): one cell per token, at L = -log p, both columns' cubics
#: gathered in the scalar loop; no log(1 - p) (the polished pass takes p and 1 - p).
_KL_SEEDS = _SEED_TABLE + '''    L = np.empty(BLOCK)
    known = np.empty((4, BLOCK))  # p, 1 - p, the two cubics (first: the place in the cell)
    p, pc, s_up, s_lo = known[0], known[1], known[2], known[3]
    cell = np.empty(BLOCK, dtype=np.int64)
    for j in range(log_p.size):  # vectorised: p, 1 - p, L = -log p and its cell
        lps = regular_log_p(clamped(log_p[j]))
        p[j], pc[j] = xp.exp(lps), -xp.expm1(lps)
        L[j] = -lps
        cell[j], s_up[j] = seed_cell_of(L[j], level_shift, base, n_cells)
    for j in range(log_p.size):  # the gathers: both cubics of the cell at s (kl_seed_values finishes them)
        c = 10 * cell[j]
        s = s_up[j]
        s_up[j] = cells[c + 2] + s * (cells[c + 3] + s * (cells[c + 4] + s * cells[c + 5]))
        s_lo[j] = cells[c + 6] + s * (cells[c + 7] + s * (cells[c + 8] + s * cells[c + 9]))'''
#: The cell of L in a seed table and L's place in it, from L's bits alone (no gathers, so the block's first loop
#: computes it, vectorised): a seed table's octaves all have the same level (:data:`.seeds.SEED_LEVEL`) and its
#: grid starts on an octave, so cell c = off[0] + (octave - first octave) * 2**level + the top ``level`` mantissa
#: bits = (bits >> shift) - base, and s = (L - L_c)/w is the fraction the mantissa bits below those make
#: (exactly what :func:`.lookup.cubic` computes from the cell's L_c and 1/w).  Clamped to the table: the ends
#: (:func:`.solvers.common.seed_start`) replace the value outside it.  The integer of those low bits becomes a float
#: by ``xp.low_bits_float``: an int64 -> float64 conversion has no AVX2 instruction, and LLVM would convert lane by
#: lane.
_SEED_CELL = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy", forceinline=True)
def seed_cell_of(L, level_shift, base, n_cells):
    bits = xp.float_bits(L)
    c = min(max((bits >> level_shift) - base, 0), n_cells - 1)
    low = xp.low_bits_float(bits & ((np.int64(1) << level_shift) - 1))
    return c, low * xp.bits_float((1023 - level_shift) << 52)
'''
_FALLBACK = '''    for i in {range}(n):
        if status[i] == np.int8(NOT_CONVERGED):
            lp = clamped(old_log_prob[i])
{solve}'''
#: The polished pass of a kind with a REFINED pass, in the block's loop: its next offsets replace the seeds.
_POLISHED_NEXT = '''lo, up, st, w_up[j], w_lo[j] = SOLVER(lp, delta, lower_at_one, ARGS)
LOWER[INDEX] = OUT(lo)
UPPER[INDEX] = OUT(up)
STATUS[INDEX] = np.int8(st)'''
#: A kind with a REFINED pass, after the block's polished loop: the tokens it left (with their next offsets)
#: compacted, so that REFINED runs in a vectorised loop over them only (up to REFINE_PASSES times, compacting
#: again after each); what is still NOT_CONVERGED then goes to the driver's fallback.
_REFINE_LEFT = '''    left = np.empty(BLOCK, dtype=np.int64)
    k = np.int64(0)  # not the literal 0: Numba would compile refine_left a second time for Literal[int](0)
    for j in range(log_p.size):  # branch-free compaction
        left[k] = j
        k += st_out[j] == np.int8(NOT_CONVERGED)
    if k > 0:
        refine_left{output}(log_p, left, k, w_up, w_lo, delta, lower_at_one, lo_out, up_out, st_out)'''
_REFINE_FUNCTION = '''

@njit(cache=True, fastmath=FASTMATH, error_model="numpy")
def refine_left{output}(log_p, left, k, d_up, d_lo, delta, lower_at_one, lo_out, up_out, st_out):
    """REFINED on the k tokens left[:k] of a block, from their next offsets d_up, d_lo (indexed like log_p)."""
    work = np.empty((6, BLOCK + PAD))  # one allocation
    lps, up_d, lo_d, los, ups, sts = work[0], work[1], work[2], work[3], work[4], work[5]
    for m in range(k):  # the gathers
        lps[m] = clamped(log_p[left[m]])
        up_d[m] = d_up[left[m]]
        lo_d[m] = d_lo[left[m]]
    for _ in range(REFINE_PASSES):
        padded = (k + PAD - 1) // PAD * PAD
        for m in range(k, padded):  # copies of the first: the vectorised loop then has no scalar remainder
            lps[m] = lps[0]
            up_d[m] = up_d[0]
            lo_d[m] = lo_d[0]
        for m in range(padded):  # vectorised
            los[m], ups[m], sts[m], up_d[m], lo_d[m] = REFINED(lps[m], delta, lower_at_one, up_d[m], lo_d[m])
        kept = 0
        for m in range(k):  # store every result; keep those still left
            j = left[m]
            lo_out[j] = OUT(los[m])
            up_out[j] = OUT(ups[m])
            st_out[j] = np.int8(sts[m])
            left[kept] = j
            lps[kept] = lps[m]
            up_d[kept] = up_d[m]
            lo_d[kept] = lo_d[m]
            kept += sts[m] == NOT_CONVERGED
        k = kept
        if k == 0:
            break
'''
#: Solve every block (counting the values above TOL), then the tokens the polished pass marked NOT_CONVERGED
#: again: with the REFINED pass where the kind has one, then the safeguarded solver (seeded kinds only).
_DRIVER = '''

@njit(cache=True, parallel={parallel}, fastmath=FASTMATH, error_model="numpy")
def band_kernel{output}{suffix}(old_log_prob, delta, lower_at_one, lower, upper, status, seed):
    """Clamp (0, TOL] to 0 and count values above TOL; bounds in float64, stored in the output dtype."""
    n = old_log_prob.size
    above = 0
    for block in {range}((n + SIZE - 1) // SIZE):
        above += solve_block{output}(old_log_prob, block * SIZE, min(block * SIZE + SIZE, n), delta,
                                     lower_at_one, lower, upper, status, seed)
{fallback}
    return above
'''


def by_value_source() -> str:
    """``by_value(bound)``: a table bound's ``fm``/``im`` arrays as tuples (see :data:`.slots.FM_SIZE`; Numba's
    parallel loops take no tuples of numbers as arguments, so the blocks make them)."""
    fm = ", ".join(f"fm[{i}]" for i in range(FM_SIZE))
    im = ", ".join(f"im[{i}]" for i in range(IM_SIZE))
    return f'''

@njit(cache=True, forceinline=True)
def by_value(bound):
    fm, im, off, shift, cells = bound
    return ({fm}), ({im}), off, shift, cells
'''


#: Tokens per block of the seeded kinds (its seed buffers stay in L1).
BLOCK = 256
#: Tokens per block of the closed forms, which keep no buffers: each block costs a call and its loop's
#: remainder, so larger blocks save time while 10k tokens still make 10 blocks for the threads.
CLOSED_BLOCK = 1024
#: How a block reads a token: the seeded kinds clamp (0, TOL] to 0 (the seeds are read at -log p); the closed
#: forms read it as it is, their conventions (:func:`.solvers.common.finish`) taking (0, TOL] as p = 1 (the
#: clamp's select is a sizeable part of TV's cost).
_READ = {"clamped": "clamped(log_p[j])", "as_is": "np.float64(log_p[j])"}
#: The refined pass runs on the tokens a block left padded to a multiple of this, LLVM's vector width here
#: (4 doubles, AVX2), so that its loop has no scalar remainder (4 measured faster than 8).
PAD = 4
#: The drivers' outputs: suffix -> what is stored of a log bound.  Each output has its own drivers (a runtime
#: flag would put exp into every vectorised loop, computed and discarded by a select); Numba compiles only
#: those called.
OUTPUTS = {"_log": "", "_ratio": "xp.exp"}


def _token(solver: str, args: str, indent: int, output: str, *, block: bool, template: str = _TOKEN,
           store: str | None = None) -> str:
    """``template`` (:data:`_TOKEN`) for ``solver``: into the block's views at ``j`` or into the outputs at ``i``,
    storing ``store`` of each bound (default: ``OUTPUTS[output]``)."""
    arrays = ("lo_out", "up_out", "st_out", "j") if block else ("lower", "upper", "status", "i")
    store = OUTPUTS[output] if store is None else store
    body = template.replace("SOLVER", solver).replace("ARGS", args).replace("OUT", store)
    for name, value in zip(("LOWER", "UPPER", "STATUS", "INDEX"), arrays, strict=True):
        body = body.replace(name, value)
    return textwrap.indent(body, " " * indent)


#: At most this many tokens the drivers run serially (on 2 cores the parallel drivers measured faster from about
#: half of it on, also when called after an idle pause).
SERIAL_MAX = 4_096


def serial_and_parallel(template: str, **names: str) -> str:
    """A parallel driver (``prange``) and a serial one (suffix ``_serial``) from one template."""
    return "".join(template.format(parallel=parallel, suffix=suffix, range=loop, **names)
                   for parallel, suffix, loop in (("True", "", "prange"), ("False", "_serial", "range")))  # fmt: skip


def _solver_drivers(kind: str, output: str) -> str:
    """The block function and the two drivers of ``kind`` storing ``output`` (a key of :data:`OUTPUTS`)."""
    solve = _registry.ENTRY_POINTS[kind]
    if kind in _registry.POLISHED:
        # the ratio output runs the passes that form the ratios themselves (no exp of a log bound per token)
        ratios = output == "_ratio"
        polished = (_registry.POLISHED_RATIO if ratios else _registry.POLISHED)[kind]
        refined = (_registry.REFINED_RATIO if ratios else _registry.REFINED).get(kind)
        store = "" if ratios else OUTPUTS[output]
        template = _POLISHED_NEXT if refined else _TOKEN
        if kind == "kl":
            seeds, loops = "*kl_seed_values(L[j], s_up[j], s_lo[j], p[j], seed), p[j], pc[j]", _KL_SEEDS
        else:
            seeds = "seed_start(w_up[j], seed, s_up[j]), seed_start(w_lo[j], seed, s_lo[j]), lq[j], p[j], pc[j]"
            loops = _SEEDS
        body = _token(polished, seeds, 8, output, block=True, template=template, store=store)
        if refined:
            body += "\n" + _REFINE_LEFT.replace("{output}", output)
        block = _BLOCK.format(output=output, seeds=loops, solve=body, read=_READ["clamped"])
        if refined:
            block += _REFINE_FUNCTION.replace("{output}", output).replace("REFINED", refined)
            block = block.replace("OUT", store)
        fallback = _FALLBACK.replace("{solve}", _token(solve, "by_value(seed)", 12, output, block=False))
    elif output == "_ratio" and kind in _registry.RATIO_ENTRY_POINTS:  # the ratios themselves, not exp of logs
        ratio = _token(_registry.RATIO_ENTRY_POINTS[kind], "seed", 8, output, block=True, store="")
        block = _BLOCK.format(output=output, seeds="", solve=ratio, read=_READ["as_is"])
        fallback = ""
    else:
        block = _BLOCK.format(output=output, seeds="", solve=_token(solve, "seed", 8, output, block=True),
                              read=_READ["as_is"])
        fallback = ""
    size = "BLOCK" if kind in _registry.POLISHED else "CLOSED_BLOCK"
    driver = _DRIVER.replace("{fallback}", fallback).replace("{output}", output).replace("SIZE", size)
    return block + serial_and_parallel(driver)


def numba_source(kind: str, extra: list[str]) -> str:
    """The generated module of a solver ``kind``: the solver source, ``extra`` lines (a generic divergence's
    constants and functions) and the drivers of both outputs."""
    # Branch-free code (every select computed, exp/log written out in numba_fast_ops, everything inlined) so that
    # LLVM vectorises the closed forms and the seeded passes; only the fallback's loop is data-dependent
    lines = [f"TOL = {LOG_P_TOLERANCE!r}", f"BLOCK = {BLOCK}", f"CLOSED_BLOCK = {CLOSED_BLOCK}", f"PAD = {PAD}",
             *extra]
    drivers = _CLAMPED + _SEED_CELL + by_value_source() + "".join(_solver_drivers(kind, output) for output in OUTPUTS)
    return generated_source([lookup, *solvers.parts(kind)], "numba_fast_ops", lines, drivers, inline=True,
                            outlined=_OUTLINED)  # fmt: skip


#: The safeguarded solvers stay calls in the generated module: their iteration loops do not vectorise, and
#: inlining them would only cost compile time
_OUTLINED = ("generic_bounds", "upper_root", "kl_bounds", "kl_upper_root")

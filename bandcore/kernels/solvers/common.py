r"""What every solver shares: status codes, the input conventions, the seed-table reads and the solver registry.

The seed of a generic root (:mod:`bandcore.kernels.seeds`) is tabulated as :math:`\log w`, :math:`w = 1/(e^d - 1)`,
in :math:`L = -\log p`; the lower root of a token is the upper root of its mirror (swap :math:`\log p` and
:math:`\log(1-p)`), so it is read at :math:`L = -\log(1-p)`.  KL's table holds both roots of a token in the cell of
:math:`L = -\log p` (:func:`kl_seed_pair`).
"""

from __future__ import annotations

from bandcore._contract import LOG_P_TOLERANCE as TOL  # absolute: kept in every bound copy of this source

from ..lookup import cubic, ends
from ..ops import numpy_ops as xp  # rebound per backend by ..sources
from ..slots import (
    F_LEFT,
    F_RIGHT,
    LEFT_END,
    OCTAVE_A,
    RIGHT_END,
    SEED_SATURATED_TO,
    SEED_UNDECIDED_TO,
    SLOPE_RIGHT,
)

#: Below this log p, p is (near-)subnormal: r, s and q are built from logarithms.
LOG_P_TINY = -700.0
#: e^LOG_P_TINY (its logarithm rounds to LOG_P_TINY): the same test on p or 1 - p, where those are at hand and their
#: logarithms are not (KL's seeded pass)
P_TINY = 9.85967654375977e-305

CONVERGED, SATURATED, NOT_CONVERGED, INVALID_INPUT = 0.0, 1.0, -2.0, -3.0


def finish(lp, lower, upper, status, lower_at_one):
    """The conventions, once: NaN or log p > TOL -> NaN (invalid); p = 1 (log p in [0, TOL]) -> (lower_at_one, 0);
    p = 0 -> (-inf, inf)."""
    return _conventions(lp, lower, upper, status, lower_at_one, 0.0, -xp.inf)


def finish_ratio(lp, lower, upper, status, lower_at_one):
    """:func:`finish` for ratio bounds: p = 1 -> (e^lower_at_one, 1), p = 0 -> (0, inf), invalid -> NaN."""
    return _conventions(lp, lower, upper, status, xp.exp(lower_at_one), 1.0, 0.0)


def _conventions(lp, lower, upper, status, lower_at_one, upper_at_one, lower_at_zero):
    """NaN (status invalid) for NaN or log p > TOL; the given bounds at p = 1 and p = 0 (upper inf), status
    SATURATED there.  log p in (0, TOL] (rounding noise) is p = 1 here, so a solver may be called on it unclamped
    (each solver reads it as log p = 0 or replaces it, see :func:`_regular`)."""
    invalid = xp.logical_not(lp <= TOL)
    at_one = lp >= 0.0
    at_zero = lp == -xp.inf
    special = xp.logical_or(at_one, at_zero)
    lower = xp.where(invalid, xp.nan, xp.where(at_one, lower_at_one, xp.where(at_zero, lower_at_zero, lower)))
    upper = xp.where(invalid, xp.nan, xp.where(at_one, upper_at_one, xp.where(at_zero, xp.inf, upper)))
    status = xp.where(invalid, INVALID_INPUT, xp.where(special, SATURATED, status))
    return lower, upper, status


def regular_log_p(lp):
    """log p with the non-regular entries (0, -inf, NaN, > 0) replaced by p = e^-1."""
    return xp.where(xp.logical_and(lp < 0.0, lp > -xp.inf), lp, -1.0)


def _regular(lp, lq=None):
    """(log p, log(1-p)) with the non-regular entries (0, -inf, NaN, > 0) replaced by p = e^-1; ``lq``: the
    log(1-p) of this very function computed before (the Numba drivers' seed loop), not computed again."""
    lps = regular_log_p(lp)
    if lq is None:
        lq = xp.log(-xp.expm1(lps))  # log(1-p) = log(-expm1(log p)), exact near p = 1
    return lps, lq


def regular_point(lp):
    """(log p, log(1-p), p, 1-p) at :func:`_regular`'s log p, p and 1 - p from one range reduction: the Numba
    blocks compute them once per token in their first loop, for the seed reads and the polished pass."""
    lps = regular_log_p(lp)
    pc = -xp.expm1(lps)  # log(1-p) = log(-expm1(log p)), exact near p = 1
    return lps, xp.log(pc), xp.exp(lps), pc


def p_and_pc(lps, p, pc):
    """(p, 1 - p) at log p = ``lps``: ``p`` and ``pc`` where the caller has them (:func:`regular_point`), else
    computed (``p is None``; in the Numba kernels exp and expm1 share their range reduction)."""
    if p is None:
        return xp.exp(lps), -xp.expm1(lps)
    return p, pc


def _mark_unseeded(lp, seeded, status):
    """NOT_CONVERGED where a polished pass could not finish a regular token (NaN, p = 1, p = 0 are final)."""
    special = xp.logical_not(xp.logical_and(lp < 0.0, lp > -xp.inf))
    return xp.where(xp.logical_or(seeded, special), status, NOT_CONVERGED)


def seed_start(L, seed, inner=None):
    """log w, w = 1/(e^d - 1), at the generic upper root of the token p = e^-L from the seed table (:mod:`.seeds`);
    NaN outside its range.  -inf (w = 0, d = inf) where the root saturates: L <= fm[SEED_SATURATED_TO]; NaN in
    the band up to fm[SEED_UNDECIDED_TO] around the saturation threshold, where only G(inf) itself can tell
    (:mod:`..seeds`).  ``inner``: the :func:`seed_cell` at L where the caller read it before (the Numba blocks
    read the cells in a scalar loop of their own and finish here, vectorised), else read here."""
    fm = seed[0]
    if inner is None:
        inner = seed_cell(L, seed)
    inside = xp.logical_and(L >= fm[LEFT_END], L <= fm[RIGHT_END])
    value = xp.where(inside, ends(L, inner, fm[LEFT_END], fm[RIGHT_END], fm[F_LEFT], fm[F_RIGHT], fm[SLOPE_RIGHT]),
                     xp.nan)  # fmt: skip
    return xp.where(L <= fm[SEED_SATURATED_TO], -xp.inf, xp.where(L <= fm[SEED_UNDECIDED_TO], xp.nan, value))


def seed_cell(L, seed):
    """The cubic of the seed table's cell that holds L (clamped to the table): all the gathers of a seed read."""
    cells = seed[4]
    return cubic(L, cells, seed_index(L, seed, cells.shape[0]))


def seed_index(L, seed, n_cells):
    """The index of L's cell in a seed table from L's bits alone, without :func:`..lookup.cell_of`'s gathers of
    its octave's ``off`` and ``shift``: a seed table has one level in all its octaves and starts on an octave, so
    the cell is off[0] + (octave - first octave) 2^level + the top ``level`` mantissa bits = (bits >> shift) - base
    (the cell the compiled drivers' ``seed_cell_of`` reads), clamped to the cells."""
    shift = seed[3][0]
    base = ((1023 + seed[1][OCTAVE_A]) << (52 - shift)) - seed[2][0]
    return xp.minimum(xp.maximum((xp.float_bits(L) >> shift) - base, 0), n_cells - 1)


def kl_seed_pair(lp, seed):
    """(log s at the upper root, log r_lo) of each token from KL's seed table (:mod:`..seeds`): both columns' cubics
    in the cell of L = -log p, the second (p log r_lo) divided by p; NaN outside the table ([a, b) in L) and at
    the conventions' special values."""
    lps = regular_log_p(lp)
    L = -lps
    cells = seed[4]
    c = seed_index(L, seed, cells.shape[0])
    s = (L - xp.take_column(cells, c, 0)) * xp.take_column(cells, c, 1)
    up = xp.take_column(cells, c, 2) + s * (xp.take_column(cells, c, 3) + s * (xp.take_column(cells, c, 4)
                                            + s * xp.take_column(cells, c, 5)))
    lo = xp.take_column(cells, c, 6) + s * (xp.take_column(cells, c, 7) + s * (xp.take_column(cells, c, 8)
                                            + s * xp.take_column(cells, c, 9)))
    return kl_seed_values(L, up, lo, xp.exp(lps), seed)


def kl_seed_values(L, up, lo, p, seed):
    """(log s at the upper root, log r_lo) from the cubics ``up`` and ``lo`` of KL's seed table at L = -log p
    (the Numba blocks gather them in a loop of their own): NaN outside [a, b), where the cell read is not L's."""
    fm = seed[0]
    inside = xp.logical_and(L >= fm[LEFT_END], L < fm[RIGHT_END])
    return xp.where(inside, up, xp.nan), xp.where(inside, lo / p, xp.nan)


def seed_offset(L, seed):
    """The offset d = log(1 + 1/w) of the seed at L (NaN where there is none)."""
    return xp.logaddexp(0.0, -seed_start(L, seed))


def seed_points(lp):
    """(L at which the upper root is read, L at which the lower root is read) from the seed table: -log p, and
    -log(1 - p), as the lower root is the upper root of the mirror token 1 - p."""
    lps, lq = _regular(lp)
    return -lps, -lq


def seed_pair(lp, seed):
    """(log w at the upper root, log w at the lower root) of each token from its seed table (NaN: no seed)."""
    L_up, L_lo = seed_points(lp)
    return seed_start(L_up, seed), seed_start(L_lo, seed)


#: kind -> bounds function name (the entry points of a bound instance)
ENTRY_POINTS = {"generic": "generic_bounds", "kl": "kl_bounds", "tv": "tv_bounds", "pearson": "pearson_bounds"}
#: kind -> a bounds function (same arguments as ENTRY_POINTS[kind]) that returns the ratios (r_lo, r_up, status)
#: directly; the other kinds' ratios are exp of their log bounds
RATIO_ENTRY_POINTS = {"tv": "tv_ratio_bounds", "pearson": "pearson_ratio_bounds"}
#: kind -> the seed read of POLISHED[kind]: its two seed arguments from (log p, seed table)
SEED_READS = {"generic": "seed_pair", "kl": "kl_seed_pair"}
#: kind -> the branch-free seeded pass run before ENTRY_POINTS[kind] (which then solves only the tokens it marks
#: NOT_CONVERGED); the closed forms have none
POLISHED = {"generic": "generic_polished_bounds", "kl": "kl_polished_bounds"}
#: kind -> the pass run (up to ``REFINE_PASSES`` times) on the tokens POLISHED[kind] left, before
#: ENTRY_POINTS[kind] solves the rest.  POLISHED[kind] of such a kind returns two more outputs, the next offsets
#: of both roots (one Newton step on): REFINED[kind] takes them in place of the seeds and returns the same five
#: outputs.  KL's polished pass leaves only tokens without a seed.
REFINED = {"generic": "generic_refined_bounds"}
#: kind -> POLISHED[kind] and REFINED[kind] returning the ratios themselves (r_lo, r_up, ...) rather than their
#: logarithms: the Numba drivers' ratio output runs these (no exp of a log bound per token)
POLISHED_RATIO = {"generic": "generic_polished_ratios", "kl": "kl_polished_ratios"}
REFINED_RATIO = {"generic": "generic_refined_ratios"}

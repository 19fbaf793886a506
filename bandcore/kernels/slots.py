r"""The named slots of a tabulated bound's metadata: ``fm`` (floats) and ``im`` (integers), see :mod:`.lookup`.

A bound's arrays are ``(fm, im, off, shift, cells)`` (:class:`.grid.KernelBound`).  The lookup source, the Numba
drivers and the table builders address ``fm`` and ``im`` by these names only.  The layouts:

* every bound: ``fm[LEFT_END:SLOPE_RIGHT + 1] = (a, b, F(a), F(b), F'(b))``, ``im = (kind, saturated left of
  a, saturated right of b, e_a)`` (``PLAIN_IM_SIZE`` entries);
* with tails (more ``im`` entries): ``im[LEFT_TAIL]``, ``im[RIGHT_TAIL]`` and their constants
  ``fm[TAIL_C], fm[TAIL_BETA]`` (left) and ``fm[TAIL_K], fm[TAIL_NU]`` (right);
* a bound split at its saturation threshold (kinds :data:`SPLIT_LOWER`, :data:`SPLIT_UPPER`): the near part's ends
  ``fm[NEAR_LEFT:NEAR_SLOPE_RIGHT + 1]``, the threshold ``L* = fm[STAR_HI] + fm[STAR_LO]`` (double-double), the exponent
  ``fm[GAMMA]``, and ``im[FAR_OCTAVES]``, ``im[FAR_CELLS]``, ``im[NEAR_OCTAVE]`` (the near grid's e_λ0) and
  ``im[NEAR_POWER]`` (the near part's stored function: 0 for :math:`G = \log u - \gamma\log\lambda`, k = 1 or 2
  for :math:`H = u/\lambda^k`, γ = k);
* a seed table (:mod:`.seeds`): kind 0, and its saturation band ``fm[SEED_SATURATED_TO]``,
  ``fm[SEED_UNDECIDED_TO]`` (the slots of the left tail, which a seed table has not).

This module holds integers only: its source is also part of every generated Numba module, where the names are
compile-time constants.
"""

# fm: a grid's ends
LEFT_END, RIGHT_END, F_LEFT, F_RIGHT, SLOPE_RIGHT = 0, 1, 2, 3, 4
# fm: the tails' constants (left: log r = C/(beta - log L); right: y + log(y + nu) = L + K, or r = K + nu L)
TAIL_C, TAIL_BETA, TAIL_K, TAIL_NU = 5, 6, 7, 8
# fm: a seed table's saturation band (seed -inf for L <= fm[SEED_SATURATED_TO], NaN up to fm[SEED_UNDECIDED_TO])
SEED_SATURATED_TO, SEED_UNDECIDED_TO = 5, 6
# fm: a split bound's near part (its grid in lambda), threshold L* (double-double) and exponent gamma
NEAR_LEFT, NEAR_RIGHT, NEAR_F_LEFT, NEAR_F_RIGHT, NEAR_SLOPE_RIGHT = 9, 10, 11, 12, 13
STAR_HI, STAR_LO, GAMMA = 14, 15, 16

# im: every bound (PLAIN_IM_SIZE entries without tails)
KIND, SATURATED_LEFT, SATURATED_RIGHT, OCTAVE_A = 0, 1, 2, 3
PLAIN_IM_SIZE = 4
# im: tails (LEFT_TAIL 1: the left tail is used; RIGHT_TAIL: RIGHT_LOG or RIGHT_LINEAR) and a split bound's parts
LEFT_TAIL, RIGHT_TAIL = 4, 5
FAR_OCTAVES, FAR_CELLS, NEAR_POWER, NEAR_OCTAVE = 6, 7, 8, 11

#: Entries of ``fm`` / ``im`` in the longest layout (a split bound with tails); :meth:`.grid.KernelBound.arrays`
#: pads every bound to it with zeros (tail modes and split fields unused), and the Numba kernels copy them into
#: tuples once per block: passed by value, they stay in registers for the whole loop, whereas array entries are
#: reloaded for every token (a store to the outputs might alias them) and every branch on them is taken per token
FM_SIZE, IM_SIZE = 17, 12

# the kinds of stored function (im[KIND])
LOG_R, RATIO, LOG_NEG_LOG_R, LOG_R_LOWER, SPLIT_LOWER, SPLIT_UPPER = 0, 1, 2, 3, 4, 5
#: how many kinds there are
KINDS = 6
# the right tail modes (im[RIGHT_TAIL])
NO_TAIL, RIGHT_LOG, RIGHT_LINEAR = 0, 1, 2

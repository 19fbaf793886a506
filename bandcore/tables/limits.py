"""Sizes a table can legitimately need: the builders stop at them and the file readers refuse anything larger."""

from __future__ import annotations

from .evaluate import MAX_LEVEL, octave_of

__all__ = ["L_RANGE", "MAX_FILE_BYTES", "MAX_KNOTS", "MAX_KNOTS_2D", "MAX_LEVEL", "MAX_METADATA_BYTES", "MAX_NODES",
           "MAX_OCTAVES", "MAX_PIECES"]  # fmt: skip

#: Tabulated range of L = -log p; outside it the end value (left) and end tangent (right) are exact to O(2^-120).
L_RANGE = (2.0**-120, 680.0)
#: knots of one bound of a 1-D table (the builder refuses to refine beyond)
MAX_KNOTS = 20_000
#: knots of one bound of a 2-D table (knots x Chebyshev nodes <= 8 MAX_KNOTS with at least 5 nodes)
MAX_KNOTS_2D = 8 * MAX_KNOTS // 5
#: delta-pieces of one saturating bound of a 2-D table (thresholds within a ratio of 1.5 each: TV over
#: delta in [1e-8, 0.99] takes 19); all its pieces together hold at most MAX_KNOTS_2D knots
MAX_PIECES = 24
#: Chebyshev nodes in delta of a 2-D table
MAX_NODES = 65
#: octaves of L_RANGE: the length of a levels array
MAX_OCTAVES = octave_of(L_RANGE[1]) - octave_of(2.0**-1022) + 1  # a grid may start at 2^-1022 (logarithmic tail)
#: a table file of any format (checked before it is read)
MAX_FILE_BYTES = 64 << 20
#: the metadata of a table file
MAX_METADATA_BYTES = 1 << 20

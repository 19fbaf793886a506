"""The figures docs/architecture.md ("Lookup tables in brief") gives for the tables, compared with the code."""

from __future__ import annotations

import pytest

from bandcore.tables import limits, split2d, tabulated, threshold

#: (what the page says, the code's value, the documented value)
DOCUMENTED = [
    ("octave cells of [2^-120, 680]", lambda: limits.L_RANGE, (2.0**-120, 680.0)),
    ("11 interior points per cell", lambda: len(tabulated.CHECK_S), 11),
    ("the largest measured error x 1.25", lambda: tabulated.GAP_FACTOR, 1.25),
    ("within 2^-24 L* of it from a 50-digit solve", lambda: (threshold.TRUST, threshold.DPS), (2.0**-24, 50)),
    ("logarithmic tails: the grid starts at 2^-1022", lambda: tabulated.L_MIN_LOG, 2.0**-1022),
    ("delta pieces whose thresholds differ by at most a factor 1.5", lambda: split2d.PIECE_RATIO, 1.5),
    ("where γ is within 0.5 of 1 or 2", lambda: (threshold.NEAR_POWER_TOLERANCE, threshold.NEAR_POWERS),
     (0.5, (1, 2))),
]


@pytest.mark.parametrize("where, value, documented", DOCUMENTED, ids=[d[0] for d in DOCUMENTED])
def test_documented_table_constant(where, value, documented):
    assert value() == documented, where

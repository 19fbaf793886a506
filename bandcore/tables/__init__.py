"""Lookup tables of the Band with a certified error (1-D in p, 2-D in (p, δ)), their files and shipped set.

Modules: :mod:`.table` (:class:`BandTable`), :mod:`.tabulated` (one bound: data, evaluation, certificate
measure), :mod:`.bounds` (building one bound by octave refinement), :mod:`.near` (a bound split at its saturation
threshold) and :mod:`.threshold` (its near part), :mod:`.tails` (logarithmic tails), :mod:`.shape` (which stored
function is smooth at each end of a bound, and what cannot be tabulated), :mod:`.bound_io` (a bound in a file);
:mod:`.grid2d` (:class:`BandTable2D`), :mod:`.chebyshev` (series in log δ), :mod:`.split2d` (saturating bounds in
δ-pieces), :mod:`.grid2d_io`; :mod:`.evaluate` (the kernels), :mod:`.pieces` (the exact solver and slopes),
:mod:`.formats` (files), :mod:`.limits`, :mod:`.shipped` (the tables in ``data/``).
"""

from __future__ import annotations

from .formats import SHIPPED_DIR, SUFFIXES, TableFileError, read_table, shipped_name, write_table
from .grid2d import BandTable2D
from .limits import L_RANGE
from .table import BandTable
from .tabulated import DEFAULT_TARGET, TabulatedBound, exact_solver, rel_log_error

__all__ = ["DEFAULT_TARGET", "L_RANGE", "SHIPPED_DIR", "SUFFIXES", "BandTable", "BandTable2D", "TableFileError",
           "TabulatedBound", "exact_solver", "read_table", "rel_log_error", "shipped_name", "write_table"]  # fmt: skip

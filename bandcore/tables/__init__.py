"""Lookup tables of the Band with a certified error (1-D in p, 2-D in (p, δ)), their files and shipped set.

Modules: :mod:`.table` (:class:`BandTable`), :mod:`.grid2d` (:class:`BandTable2D`), :mod:`.bounds` (building
and certifying one bound), :mod:`.shape` (which stored function is smooth at each end of a bound, and what
cannot be tabulated), :mod:`.evaluate` (the kernels), :mod:`.pieces` (the exact solver and slopes),
:mod:`.formats` (files), :mod:`.limits`, :mod:`.shipped` (the tables in ``data/``).
"""

from __future__ import annotations

from .bounds import DEFAULT_TARGET, L_RANGE, TabulatedBound, exact_solver, rel_log_error
from .formats import SHIPPED_DIR, SUFFIXES, TableFileError, read_table, shipped_name, write_table
from .grid2d import BandTable2D
from .table import BandTable

__all__ = ["DEFAULT_TARGET", "L_RANGE", "SHIPPED_DIR", "SUFFIXES", "BandTable", "BandTable2D", "TableFileError",
           "TabulatedBound", "exact_solver", "read_table", "rel_log_error", "shipped_name", "write_table"]  # fmt: skip

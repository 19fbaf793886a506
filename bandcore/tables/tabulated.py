r"""One tabulated bound: its data and evaluation, the stored function it keeps, and the certificate's measure.

A bound stores one function :math:`F` of :math:`L = -\log p` (its *kind*: :math:`\log r`, :math:`r`,
:math:`\log(-\log r)`, or :math:`\log r` of a lower bound) as cubic Hermite cells on the octave grid of
:mod:`bandcore.kernels.grid`, with slopes :math:`dF/dL` from implicit differentiation of :math:`g_f`.  The
certificate's measure is :math:`|\Delta\log r| / \max(1, |\log r|)`, rounded up by :func:`certificate`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..divergences import Divergence
from ..kernels.slots import LOG_NEG_LOG_R, LOG_R, LOG_R_LOWER, RATIO, RIGHT_LINEAR, RIGHT_LOG  # the kernel's names
from .evaluate import KernelBound, eval_log, octave_of, pack
from .pieces import bisection_band_log

__all__ = ["BUILDER", "DEFAULT_TARGET", "LOG_NEG_LOG_R", "LOG_R", "LOG_R_LOWER", "RATIO", "TabulatedBound",
           "TargetNotReached", "certificate", "exact_solver", "rel_log_error", "stored"]  # fmt: skip

#: Default certified error target, |Δ log r| / max(1, |log r|).
DEFAULT_TARGET = 1e-7
#: Written into every table as ``builder``: identifies the building and certifying code, not the package version
#: (a release that does not change them must not change a table's bytes).  Bump it when a change to this package
#: changes any table's content.
BUILDER = "bandcore.tables 3"
CHECK_S = np.arange(1, 12) / 12.0  # check points per cell, midpoint included
GAP_FACTOR = 1.25  # certificate margin for the gaps between check points
#: the tails outside L_RANGE that the certificate also measures (left: down to p = 1; right: p < e^-680)
LEFT_TAIL = np.array([2.0**-121, 2.0**-200, 1e-300, 5e-324, 0.0])
RIGHT_TAIL = np.array([690.0, 700.0, 1e3])
#: the same for a bound with a logarithmic left tail (grid down to L_MIN_LOG) or right tail
LEFT_TAIL_LOG = np.concatenate([LEFT_TAIL, [2.0**-1023, 1e-310, 1e-320]])
RIGHT_TAIL_LOG = np.array([690.0, 700.0, 1e3, 2e3])
#: where the grid of a bound with a logarithmic left tail starts (the smallest normal float64)
L_MIN_LOG = 2.0**-1022
METHOD = "cubic Hermite in L = -log(p) on octave cells, slopes by implicit differentiation of g_f"
ERROR_MEASURE = "|Δ log r| / max(1, |log r|)"


def exact_solver() -> Callable[[np.ndarray, Divergence, float], tuple[np.ndarray, np.ndarray]]:
    """The exact solver tables sample and certify against: :func:`bandcore.tables.pieces.bisection_band_log`.

    It bisects the float64 bit patterns of :math:`\\pm\\log r` on the cancellation-free :math:`g_f` of
    :mod:`bandcore.tables.pieces`: slow (128 evaluations of :math:`g_f`), obviously correct, independent of the
    fast backends it is used to check (tests compare it with the mpmath oracle).
    """
    return bisection_band_log


@dataclass(frozen=True)
class TabulatedBound:
    """One bound: knots in L, stored values and slopes dF/dL, octave levels, the kind of stored function.

    ``saturated_left``: an upper bound with :math:`r = 1/p` for :math:`L \\le` ``knots[0]``;
    ``saturated_right``: a lower bound with :math:`r = 0` for :math:`L \\ge` ``knots[-1]``.
    """

    knots: np.ndarray
    values: np.ndarray
    slopes: np.ndarray
    levels: np.ndarray
    kind: int
    saturated_left: bool = False
    saturated_right: bool = False
    #: (C, beta): left of the first knot log r = C / (beta - log L) (a bound whose log r -> 0 like 1/log(1/L))
    left_tail: tuple[float, float] | None = None
    #: (K, nu): right of the last knot y + log(y + nu) = L + K (an upper bound with y = log r ~ L - log L)
    right_tail: tuple[float, float] | None = None
    #: the right tail is r = K + nu L instead (an upper bound of a generator growing like e^(bu): r ~ (L + K)/b)
    right_linear: bool = False

    @cached_property
    def kernel(self) -> KernelBound:
        """The arrays the evaluation kernels read (Horner cells, octave offsets)."""
        packed = pack(self.knots, self.values, self.slopes, self.levels, self.kind, self.saturated_left,
                      self.saturated_right)  # fmt: skip
        if self.left_tail is None and self.right_tail is None:
            return packed  # the four-entry imeta of the original kinds: no tail modes
        return KernelBound(fmeta=np.concatenate([packed.fmeta, self.tail_fmeta()]),
                           imeta=np.concatenate([packed.imeta, self.tail_imeta()]), off=packed.off,
                           levels=packed.levels, cells=packed.cells)  # fmt: skip

    def tail_fmeta(self) -> np.ndarray:
        """``(C, beta, F_r, F'_r)`` of the kernel's tail modes (zeros where unused; see :func:`tail_log`)."""
        c, beta = self.left_tail if self.left_tail is not None else (0.0, 0.0)
        k, nu = self.right_tail if self.right_tail is not None else (0.0, 0.0)
        return np.array([c, beta, k, nu], dtype=np.float64)

    def tail_imeta(self) -> np.ndarray:
        right = 0 if self.right_tail is None else RIGHT_LINEAR if self.right_linear else RIGHT_LOG
        return np.array([self.left_tail is not None, right], dtype=np.int64)

    def log(self, L: np.ndarray) -> np.ndarray:
        """This bound's log r at float64 ``L`` through the evaluation kernel (the build and certificate use it).

        The kernel's NumPy binding: the same source as the Numba and torch ones (:mod:`bandcore.kernels.lookup`),
        element by element with no threads and no fast-math contraction, so a build cannot depend on the thread
        count or on how Numba vectorises (the compiled bindings agree with it to a few ulps, far inside the
        certificate's margin)."""
        log_p = -np.ascontiguousarray(L, dtype=np.float64).ravel()
        out = eval_log(log_p, self.kernel, self.kernel, np.float64, math.inf, backend="numpy")[0]
        return out.reshape(np.shape(L))

    def check_points(self, per_cell: np.ndarray) -> np.ndarray:
        """Interior points ``knots[c] + s·w_c`` for ``s`` in ``per_cell`` (shape (n_cells, m) or (m,))."""
        w = np.diff(self.knots)
        s = per_cell if per_cell.ndim == 2 else np.broadcast_to(per_cell, (len(w), len(per_cell)))
        return self.knots[:-1, None] + w[:, None] * s

    def tails(self) -> np.ndarray:
        """The certificate's points outside the grid on the sides that are not saturated."""
        left = [] if self.saturated_left else LEFT_TAIL if self.left_tail is None else LEFT_TAIL_LOG
        right = [] if self.saturated_right else RIGHT_TAIL if self.right_tail is None else RIGHT_TAIL_LOG
        return np.concatenate([left, right]).astype(np.float64)


def stored(kind: int, L: np.ndarray, y: np.ndarray, parts, kink: float | None = None):
    """Stored values and slopes dF/dL from exact log-bounds y at L; at ``L == kink`` (a saturation threshold,
    the end of the grid) the slope is the unsaturated side's."""
    with np.errstate(all="ignore"):
        if kind == RATIO:
            return np.exp(y), parts.slope_in_L(L, y, ratio=True)
        slope = parts.slope_in_L(L, y, kink=L == kink)
        if kind in (LOG_R, LOG_R_LOWER):
            return y, slope
        return np.log(-y), slope / y  # d/dL log(-y) = y'/y


def certificate(measured: float) -> float:
    """``GAP_FACTOR × measured``, rounded *up* to 3 significant digits (still a bound, and its digits do not
    carry the last bits of a measurement)."""
    value = GAP_FACTOR * float(measured)
    if not (math.isfinite(value) and value > 0):
        return value
    exponent = math.floor(math.log10(value)) - 2
    digits = math.ceil(round(value / 10.0**exponent, 9))
    return float(f"{digits}e{exponent}")


def rel_log_error(approx: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """The certificate's measure :math:`|\\hat y - y| / \\max(1, |y|)` (0 where equal, inf for NaN)."""
    with np.errstate(invalid="ignore"):
        err = np.abs(approx - exact) / np.maximum(1.0, np.abs(exact))
    err = np.where(approx == exact, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def n_octaves(a: float, b: float) -> int:
    """Number of octaves from the one holding ``a`` to the one holding the last float below ``b``."""
    return octave_of(np.nextafter(b, 0.0)) - octave_of(a) + 1


def grid_size(a: float, b: float, levels: np.ndarray) -> int:
    """``len(octave_grid(a, b, levels))``, counted without building the grid (exact: powers of 2 only)."""
    e_a, total = octave_of(a), 2
    for o, k in enumerate(np.asarray(levels, dtype=np.int64).tolist()):
        e, n = e_a + o, 2**k
        j_min = math.floor((math.ldexp(a, -e) - 1.0) * n) + 1 if o == 0 else 0  # grid points > a
        if b >= math.ldexp(1.0, e + 1):
            j_max = n - 1  # the whole octave lies below b (no ldexp overflow for octaves far below b)
        else:
            j_max = min(n - 1, math.ceil((math.ldexp(b, -e) - 1.0) * n) - 1)  # grid points < b
        total += max(0, j_max - max(j_min, 0) + 1)
    return total


def cell_octaves(knots: np.ndarray) -> np.ndarray:
    """Octave index (from the first knot's) of every cell."""
    return np.frexp(knots[:-1])[1] - np.frexp(knots[0])[1]


class TargetNotReached(ValueError):
    """The octave refinement hit :data:`MAX_LEVEL` or :data:`MAX_KNOTS` before the target."""


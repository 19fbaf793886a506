r"""The octave grid of a lookup table and the arrays :mod:`.lookup` reads (NumPy; built once per table)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .slots import FM_SIZE, IM_SIZE

__all__ = ["MAX_LEVEL", "KernelBound", "cell_offsets", "horner_cells", "octave_grid", "octave_of", "pack"]

#: finest level: cells must be addressable by the 23 mantissa bits of a float32 input
MAX_LEVEL = 23


def octave_of(value: float) -> int:
    """:math:`e` with :math:`2^e \\le v < 2^{e+1}` (exact, from ``frexp``) for a positive finite ``value``."""
    return int(np.frexp(value)[1]) - 1


def octave_grid(a: float, b: float, levels: np.ndarray) -> np.ndarray:
    """Knots on ``[a, b]``: ``a``, every grid point :math:`2^e(1 + j 2^{-k_e})` strictly inside, ``b``.

    ``levels[o]`` is :math:`k_e` of octave :math:`e = e_a + o`, from the octave of ``a`` to that of the last
    point below ``b``.  Grid points are exact binary fractions, so the knots are reproducible bit for bit.
    """
    e_a = octave_of(a)
    inner = [
        np.ldexp(1.0 + np.arange(2**k) / 2.0**k, e_a + o)  # 2^e (1 + j/2^k), exact
        for o, k in enumerate(np.asarray(levels, dtype=np.int64))
    ]
    grid = np.concatenate(inner)
    return np.concatenate([[a], grid[(grid > a) & (grid < b)], [b]])


def cell_offsets(a: float, levels: np.ndarray) -> np.ndarray:
    """``off[o]``: the cell index of grid cell :math:`j = 0` of octave :math:`e_a + o`.

    In the first octave the cells left of ``a`` do not exist, so its offset is :math:`-j_0`, with :math:`j_0` the
    grid cell holding ``a``; later octaves follow with :math:`2^{k}` cells each.
    """
    levels = np.asarray(levels, dtype=np.int64)
    j0 = int(np.floor((np.ldexp(a, -octave_of(a)) - 1.0) * 2.0 ** levels[0]))  # exact: scaling by powers of 2
    counts = 2 ** levels
    return np.concatenate([[-j0], -j0 + np.cumsum(counts)[:-1]]).astype(np.int64)


def horner_cells(knots: np.ndarray, values: np.ndarray, slopes: np.ndarray) -> np.ndarray:
    """(n_cells, 6) rows :math:`(L_c, 1/w, c_0, c_1, c_2, c_3)` (see the module docstring)."""
    w = np.diff(knots)
    f0, f1, d0, d1 = values[:-1], values[1:], slopes[:-1] * w, slopes[1:] * w
    return np.stack([knots[:-1], 1.0 / w, f0, d0, 3 * (f1 - f0) - 2 * d0 - d1, 2 * (f0 - f1) + d0 + d1], axis=1)


@dataclass(frozen=True)
class KernelBound:
    """The arrays :func:`bound_log` reads for one tabulated function (computed once per table).

    ``fmeta = (a, b, F(a), F(b), F'(b))``, ``imeta = (kind, saturated left of a, saturated right of b, e_a)``
    (and longer layouts: :mod:`.slots`),
    ``off``/``levels`` per octave, ``cells`` as :func:`horner_cells`.
    """

    fmeta: np.ndarray
    imeta: np.ndarray
    off: np.ndarray
    levels: np.ndarray
    cells: np.ndarray

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(fm, im, off, shift, cells)`` as NumPy arrays (the Numba kernels' argument, which only read them),
        ``fm``/``im`` padded with zeros to :data:`FM_SIZE` / :data:`IM_SIZE` entries; made once per bound."""
        return self._kernel_arrays

    @cached_property
    def _kernel_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        fm = np.zeros(max(FM_SIZE, self.fmeta.size))
        im = np.zeros(max(IM_SIZE, self.imeta.size), dtype=np.int64)
        fm[: self.fmeta.size], im[: self.imeta.size] = self.fmeta, self.imeta
        return fm, im, self.off, (52 - self.levels).astype(np.int64), self.cells

    def torch_arrays(self, device) -> tuple:
        """The same for the torch binding: ``fm``/``im`` as Python numbers, the rest as tensors on ``device``."""
        import torch

        return (tuple(self.fmeta.tolist()), tuple(self.imeta.tolist()),
                torch.as_tensor(self.off, device=device), torch.as_tensor(52 - self.levels, device=device),
                torch.as_tensor(self.cells, dtype=torch.float64, device=device))  # fmt: skip

    def numpy_arrays(self) -> tuple:
        """The same for the NumPy binding (``fm``/``im`` as Python numbers)."""
        fm, im, off, shift, cells = self.arrays()
        return tuple(fm.tolist()), tuple(im.tolist()), off, shift, cells


def pack(knots, values, slopes, levels, kind: int, saturated_left: bool, saturated_right: bool) -> KernelBound:
    """The kernel arrays of one tabulated function on ``knots`` (an :func:`octave_grid`)."""
    a, b = float(knots[0]), float(knots[-1])
    return KernelBound(
        fmeta=np.array([a, b, values[0], values[-1], slopes[-1]], dtype=np.float64),
        imeta=np.array([kind, saturated_left, saturated_right, octave_of(a)], dtype=np.int64),
        off=cell_offsets(a, levels),
        levels=np.asarray(levels, dtype=np.int64),
        cells=np.ascontiguousarray(horner_cells(knots, values, slopes)),
    )

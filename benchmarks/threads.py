"""Thread counts for ``bandcore bench``: torch's and Numba's set together, to the same number.

Every threaded method of the benchmark (the published solver and the torch backend through torch; the Numba
backend, ``band()``'s default when it picks Numba and the table kernels through Numba) runs after
:func:`set_threads` has set **both** libraries to the same count, so the two sides of every ratio run on equal
threads.  NumPy (the NumPy backend, ``band()``'s default when it picks NumPy, and the ``np.exp`` pass) is
single-threaded whatever the setting.
"""

from __future__ import annotations

import os

from bandcore._contract import check_positive_int

__all__ = ["THREAD_SETTING", "get_threads", "resolve_threads", "set_threads"]

#: how each side's threads are set, for the report
THREAD_SETTING = {
    "published": "torch.set_num_threads(t) (the published solver is torch; float32 and float64 alike)",
    "auto": "numba.set_num_threads(t) and torch.set_num_threads(t) (band()'s default backend: Numba or NumPy)",
    "torch": "torch.set_num_threads(t)",
    "numba": "numba.set_num_threads(t)",
    "table": "numba.set_num_threads(t) (the table's Numba kernel)",
    "numpy": "single-threaded (NumPy), the same measurement in both columns",
    "exp_pass": "single-threaded (np.exp on float64)",
}


def _numba_max_threads() -> int | None:
    try:
        import numba
    except ImportError:
        return None
    return int(numba.config.NUMBA_NUM_THREADS)


def get_threads() -> tuple[int, int | None]:
    """(torch intra-op threads, Numba threads or None without Numba)."""
    import torch

    try:
        import numba
    except ImportError:
        return torch.get_num_threads(), None
    return torch.get_num_threads(), int(numba.get_num_threads())


def set_threads(torch_threads: int, numba_threads: int | None = -1) -> None:
    """Set torch's and Numba's thread counts (Numba's to ``torch_threads`` unless given)."""
    import torch

    if torch.get_num_threads() != torch_threads:  # setting it again is not free in every torch build
        torch.set_num_threads(torch_threads)
    numba_threads = torch_threads if numba_threads == -1 else numba_threads
    if numba_threads is not None and _numba_max_threads() is not None:
        import numba

        numba.set_num_threads(numba_threads)


def resolve_threads(threads: int | None) -> int:
    """The thread count of the run: ``threads`` or the machine's cores, within what Numba was started with."""
    cores = os.cpu_count() or 1
    numba_max = _numba_max_threads()
    if threads is None:
        return min(cores, numba_max) if numba_max else cores
    threads = check_positive_int(threads, "threads")
    if numba_max is not None and threads > numba_max:
        raise ValueError(
            f"threads must be at most {numba_max} (Numba's NUMBA_NUM_THREADS; set that variable to allow more), "
            f"got threads={threads}"
        )
    return threads

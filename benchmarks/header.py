"""The header of a ``bandcore bench`` report: versions, machine, settings, how threads and times were taken,
and the copy roofline (:func:`~benchmarks.timing.copy_roofline`, measured on the run's threads)."""

from __future__ import annotations

import datetime
import os
import platform
from typing import Any

import numpy as np

from bandcore.kernels.backends import SERIAL_MAX

from .threads import THREAD_SETTING, get_threads, set_threads
from .timing import copy_roofline

__all__ = ["TORCH_GRAIN", "header", "load_average", "thread_note"]

#: torch's grain: element-wise work on at most this many elements runs on one thread
TORCH_GRAIN = 32_768


def thread_note(threads: int, sizes: tuple[int, ...]) -> str:
    """How the two thread columns were set, and where a library runs serially whatever the setting."""
    note = (
        f"every row is timed on 1 thread and on all {threads} thread(s): before each batch torch and Numba are "
        f"both set to the row's count (the published solver is torch; bandcore's rows are torch or Numba); "
        f"the NumPy backend and the np.exp pass are single-threaded"
    )
    small = []
    if threads > 1 and min(sizes) <= SERIAL_MAX:
        small.append(f"at {SERIAL_MAX:,} tokens or fewer bandcore's Numba drivers run serially")
    if threads > 1 and min(sizes) <= TORCH_GRAIN:
        small.append(f"torch splits element-wise work into chunks of {TORCH_GRAIN:,} elements")
    if small:
        text = " and ".join(small)
        note += f". {text[0].upper()}{text[1:]}, so those calls use one thread whatever the setting"
    return note


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # not on this platform
        return None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def vector_extensions() -> list[str]:
    """The AVX extensions NumPy found on this CPU: they set the unit of the report (NumPy's float64 ``np.exp`` took
    0.8 ns a value on a machine with AVX-512, 5.6 on one with AVX2 only) and the width of the Numba kernels'
    vectors (8 or 4 doubles); empty where NumPy does not say."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:
        return []
    return sorted(name for name, found in __cpu_features__.items() if found and name.startswith("AVX"))


def header(settings: dict[str, Any], distributions: dict[str, str]) -> dict[str, Any]:
    """A report with its header filled in and empty ``results``, ``blocks``, ``tables``, ``unavailable``.

    ``settings``: the run's settings (``command`` among them); ``distributions``: name -> description.
    """
    import torch

    from bandcore import __version__

    settings = dict(settings)
    threads = settings["threads"]
    set_threads(threads)
    torch_threads, numba_threads = get_threads()
    numba_version = None
    if numba_threads is not None:
        import numba

        numba_version = numba.__version__
    return {
        "bandcore_version": __version__,
        "command": settings.pop("command"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_model": cpu_model(),
            "vector_extensions": vector_extensions(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "numba": numba_version,
            "numpy": np.__version__,
            "torch_threads": torch_threads,
            "numba_threads": numba_threads,
            "gpu": "not used (CPU run)",
            "load_average_start": load_average(),  # 1, 5, 15 min: other work on the machine while it ran
        },
        **settings,
        "dtype": "float32",
        "thread_note": thread_note(threads, settings["sizes"]),
        "thread_setting": THREAD_SETTING,
        "numba_serial_max": SERIAL_MAX,
        "timing": (
            f"median per-call time over {settings['rounds']} interleaved rounds (every method on 1 and on "
            f"{threads} thread(s) and one np.exp pass, A B C ... each round), each entry a batch of back-to-back "
            f"calls lasting >= {settings['min_round_seconds'] * 1e3:g} ms; the first call is excluded "
            f"(first_call_seconds)"
        ),
        "generators": distributions,
        "accuracy_measure": "max |Δ log r| / max(1, |log r|) vs the mpmath oracle (50 digits), float64 inputs "
        "drawn from every distribution of the run (a ratio that under- or overflows must be the rounded exact one)",
        "outputs": "every row computes ratio bounds (r_lo, r_up) from float32 log-probs, in float32: the published "
        "solver (computing in float32, as trainers run it), bandcore's exact rows (band()) and its tables "
        "(BandTable.__call__); published-fp64 is the published solver on the same log-probs as float64, "
        "computing and returning float64",
        "copy": copy_roofline(threads, 3),
        "blocks": [],
        "results": [],
        "tables": {},
        "unavailable": {},
    }

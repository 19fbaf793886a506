r"""Timing and the memory roofline of ``bandcore bench``.

:func:`interleaved` times several callables in rounds, A B C A B C ...: every round runs each callable's batch
of back-to-back calls once, in the same order, so a slow spell of the machine (another process, frequency
scaling) falls on every callable of the round alike instead of on whichever happened to run then.  Each
callable's per-call time is kept per round; :func:`summarise` gives their median, quartiles and range.  Ratios
of medians from the same rounds are what the benchmark reports.

:func:`time_call` times one callable: the first call (imports, compilation, cache loads) separately, then the
best of ``repeats`` timed repeats, each of enough back-to-back calls to last ``min_seconds`` (so that a call of
a few microseconds on 10k tokens is timed as precisely as one of a second on 1M).

:func:`copy_roofline` measures the copy bandwidth **out of cache**: source and destination are each at least
four times the last-level cache (:func:`last_level_cache`), both already faulted in, and the copy writes into
the preallocated destination.  It is timed with NumPy (one thread), torch and a Numba ``prange`` loop (both on
the run's thread count); the fastest sets the bandwidth :math:`B` (bytes read + bytes written per second, as
STREAM counts them).  A Band evaluation reads the input and writes two outputs of the same dtype, so it cannot
beat :math:`B / (3 \cdot \mathrm{itemsize})` tokens per second.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FALLBACK_LLC_BYTES", "Timed", "copy_roofline", "interleaved", "last_level_cache", "summarise", "time_call"]

#: Assumed last-level cache when the machine does not say (a large server L3 slice).
FALLBACK_LLC_BYTES = 32 * 2**20
_CACHE_DIR = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


#: One timed entry of :func:`interleaved`: (key, the callable, what to run untimed before each of its batches).
Timed = tuple[str, Callable[[], Any], Callable[[], None]]


def _batch(fn: Callable[[], Any], calls: int, timer: Callable[[], float]) -> float:
    start = timer()
    for _ in range(calls):
        fn()
    return (timer() - start) / calls


def interleaved(
    entries: Sequence[Timed],
    rounds: int,
    min_seconds: float,
    timer: Callable[[], float] = time.perf_counter,
) -> dict[str, dict[str, Any]]:
    """Time ``entries`` in ``rounds`` interleaved rounds; key -> ``{"calls_per_round", "rounds"}``.

    First, per entry: its setup, then one call timed to size its batch, ``calls`` = enough back-to-back calls
    to last about ``min_seconds`` (at most 10,000).  Then ``rounds`` times, for each entry in the given order:
    its setup (untimed: e.g. setting the thread count), then its batch, whose mean per-call time joins
    ``rounds``.  ``timer`` is the clock (seconds); the callables should have been called once already (imports,
    compilation).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds}")
    calls = {}
    for key, fn, setup in entries:
        setup()
        estimate = _batch(fn, 1, timer)
        calls[key] = int(min(10_000, max(1, math.ceil(min_seconds / max(estimate, 1e-7)))))
    times: dict[str, list[float]] = {key: [] for key, _, _ in entries}
    for _ in range(rounds):
        for key, fn, setup in entries:
            setup()
            times[key].append(_batch(fn, calls[key], timer))
    return {key: {"calls_per_round": calls[key], "rounds": times[key]} for key in times}


def summarise(values: Sequence[float]) -> dict[str, float]:
    """``median``, ``q1``, ``q3`` (linear interpolation, as ``numpy.percentile``), ``min`` and ``max`` of
    ``values``."""
    if not values:
        raise ValueError("summarise needs at least one value")
    q1, median, q3 = (float(v) for v in np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75]))
    return {"median": median, "q1": q1, "q3": q3, "min": float(min(values)), "max": float(max(values))}


def time_call(fn: Callable[[], Any], repeats: int, min_seconds: float = 0.02) -> dict[str, float | int]:
    """``first`` call seconds, then ``seconds``: the best per-call time over ``repeats`` timed repeats.

    Each repeat runs ``calls`` back-to-back calls (enough to last about ``min_seconds``, estimated from a second
    untimed call) and counts their mean; ``calls`` is returned too.
    """
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    start = time.perf_counter()
    fn()
    estimate = time.perf_counter() - start
    calls = int(min(10_000, max(1, math.ceil(min_seconds / max(estimate, 1e-7)))))
    best = math.inf
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return {"first_call_seconds": first, "seconds": best, "calls_per_repeat": calls}


def _parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in _UNITS else ""
    return int(text[: len(text) - len(unit)]) * _UNITS[unit]


def last_level_cache(cache_dir: Path = _CACHE_DIR) -> dict[str, Any]:
    """The last-level cache of CPU 0: ``{"bytes", "level", "source"}`` plus a ``"note"`` when it is assumed.

    Read from ``cache_dir/index*/{level,type,size}`` (Linux sysfs), else ``os.sysconf("SC_LEVEL3_CACHE_SIZE")``
    (glibc), else :data:`FALLBACK_LLC_BYTES` with a note saying so.
    """
    found: tuple[int, int] | None = None
    for index in sorted(cache_dir.glob("index*")):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            entry = (int((index / "level").read_text()), _parse_size((index / "size").read_text()))
        except (OSError, ValueError, IndexError):
            continue
        if entry[1] > 0 and (found is None or entry > found):
            found = entry
    if found is not None:
        return {"bytes": found[1], "level": found[0], "source": f"{cache_dir}/index*/size"}
    try:
        size = int(os.sysconf("SC_LEVEL3_CACHE_SIZE"))
    except (ValueError, OSError, AttributeError):
        size = 0
    if size > 0:
        return {"bytes": size, "level": 3, "source": 'os.sysconf("SC_LEVEL3_CACHE_SIZE")'}
    return {
        "bytes": FALLBACK_LLC_BYTES,
        "level": None,
        "source": "fallback",
        "note": f"the last-level cache size is not readable here: assumed {FALLBACK_LLC_BYTES // 2**20} MiB",
    }


def _numba_copy() -> Callable[[np.ndarray, np.ndarray], None] | None:
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(parallel=True, cache=True)
    def copy(src, dst):  # pragma: no cover - compiled
        for i in numba.prange(src.shape[0]):
            dst[i] = src[i]

    return copy


def copy_roofline(threads: int, repeats: int, itemsize: int = 4, llc: dict[str, Any] | None = None) -> dict[str, Any]:
    """Out-of-cache copy bandwidth and the roofline it sets for ``itemsize``-byte tokens (see the module doc).

    ``threads`` is recorded for the torch and Numba copies (the caller has set both libraries to it).
    """
    import torch

    llc = last_level_cache() if llc is None else llc
    n = int(llc["bytes"])  # float32 elements of 4 bytes: each array is 4x the last-level cache
    src = np.ones(n, dtype=np.float32)  # written, so its pages are resident before timing
    dst = np.zeros(n, dtype=np.float32)
    src_t, dst_t = torch.from_numpy(src), torch.from_numpy(dst)
    copies: dict[str, tuple[Callable[[], Any], int]] = {
        "numpy": (lambda: np.copyto(dst, src), 1),
        "torch": (lambda: dst_t.copy_(src_t), threads),
    }
    kernel = _numba_copy()
    if kernel is not None:
        copies["numba"] = (lambda: kernel(src, dst), threads)
    moved = 2 * src.nbytes  # read + write
    methods = {}
    for name, (fn, used) in copies.items():
        timing = time_call(fn, max(repeats, 3), min_seconds=0.0)
        methods[name] = {"threads": used, "seconds": timing["seconds"], "gb_per_s": moved / timing["seconds"] / 1e9}
    bandwidth = max(m["gb_per_s"] for m in methods.values()) * 1e9
    out: dict[str, Any] = {
        "array_bytes": int(src.nbytes),
        "llc": llc,
        "methods": methods,
        "gb_per_s": bandwidth / 1e9,
        "bytes_per_token": 3 * itemsize,  # input + two outputs
        "roofline_mtok_s": bandwidth / (3 * itemsize) / 1e6,
        "measure": "preallocated copy of arrays >= 4x the last-level cache; bytes read + written per second; "
        "the fastest of the copies sets the roofline",
    }
    if "note" in llc:
        out["note"] = llc["note"]
    return out

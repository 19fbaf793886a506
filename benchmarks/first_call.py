"""A user's first call of ``band()`` for the benchmark: ``band(x, divergence, delta)`` with its default backend,
measured in a fresh subprocess, where nothing of the divergence has run yet.

The in-process rows of ``bandcore bench`` exclude every method's first call (imports, the plan, seed tables,
Numba compilation or a load from the cache on disk) and run ``auto`` after the accuracy pass and the block's
first calls, so there it picks from kernels the run itself has made ready.  A user's process starts with none:
``backend="auto"`` then picks Numba from :data:`bandcore.band.AUTO_NUMBA_MIN_SIZE` tokens on, or where the
kernel's machine code is in the cache on disk, and NumPy otherwise (:meth:`bandcore.band.BoundBand.pick`).  The
subprocess reports what that first call took and ran on, and the median of the calls after it, which run on the
same backend (nothing else compiles a kernel in that process).  It uses the machine's kernel cache
(``BANDCORE_CACHE``) as it finds it, and its default threads.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

__all__ = ["NEXT_CALLS", "measure_first_call"]

#: calls timed after the first one (their median is reported)
NEXT_CALLS = 5


def _first_call_child(divergence: str, delta: float, distribution: str, n: int, seed: int) -> None:
    """Run in a subprocess: print the first call's time and backend, and the next calls' median, as JSON."""
    import statistics

    from benchmarks.inputs import log_probs

    x = log_probs(distribution, n, seed)
    start = time.perf_counter()
    from bandcore.band import band
    from bandcore.kernels.backends import CACHE

    imported = time.perf_counter()
    band(x, divergence, delta)
    first = time.perf_counter() - imported
    bound = sorted({key[3] for key in CACHE.keys() if key[0] == "solver"})  # what the call ran (bound, then run)
    times = []
    for _ in range(NEXT_CALLS):
        begin = time.perf_counter()
        band(x, divergence, delta)
        times.append(time.perf_counter() - begin)
    again = sorted({key[3] for key in CACHE.keys() if key[0] == "solver"})
    print(json.dumps({"import_seconds": imported - start, "first_call_seconds": first, "backend": "+".join(bound),
                      "next_call_seconds": statistics.median(times), "next_backend": "+".join(again)}))  # fmt: skip


def measure_first_call(divergence: str, delta: float, distribution: str, n: int, seed: int) -> dict[str, Any]:
    """``band(x, divergence, delta)``'s first call on ``n`` float32 tokens of ``distribution`` in a fresh subprocess:
    ``first_call_seconds`` and the ``backend`` it ran, ``next_call_seconds`` (median of :data:`NEXT_CALLS` calls
    after it) and theirs (``next_backend``), ``import_seconds`` (``bandcore.band``, not in the first call); or
    ``error``."""
    code = (
        "from benchmarks.first_call import _first_call_child; "
        f"_first_call_child({divergence!r}, {delta!r}, {distribution!r}, {n}, {seed})"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    row: dict[str, Any] = {"divergence": divergence, "distribution": distribution, "n_tokens": n}
    if proc.returncode != 0:
        row["error"] = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "subprocess failed"
        return row
    row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return row

"""Peak memory for the benchmark: the peak extra resident memory of one method, measured in a fresh subprocess
(``/proc/self/clear_refs`` + ``VmHWM``) on the ``llm`` distribution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .inputs import llm_like_log_probs
from .threads import set_threads

__all__ = ["measure_memory"]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def _memory_child(method: str, divergence: str, delta: float, n: int, threads: int) -> None:
    """Run in a subprocess: print the peak extra resident memory of one call as JSON."""
    set_threads(threads)
    x = llm_like_log_probs(n, seed=0)
    if method == "table":
        from bandcore.tables import BandTable

        try:
            table = BandTable.shipped(divergence, delta)
        except FileNotFoundError:
            table = BandTable.build(divergence, delta)
        fn, arg = table.log, x
    else:
        from bandcore.band import band

        if method == "torch":
            import torch

            arg = torch.from_numpy(x)
        else:
            arg = x

        def fn(a):
            return band(a, divergence, delta, backend=method)

    fn(arg[:1000])  # imports, compilation / cache load
    Path("/proc/self/clear_refs").write_text("5")  # reset the VmHWM high-water mark
    base = _status_kib("VmRSS")
    result = fn(arg)
    peak = _status_kib("VmHWM")
    del result
    print(json.dumps({"peak_extra_bytes": (peak - base) * 1024}))


def measure_memory(method: str, divergence: str, delta: float, n: int, threads: int) -> dict[str, Any]:
    """Peak extra resident bytes of one ``method`` call on ``n`` tokens, from a fresh subprocess (or ``error``)."""
    code = (
        "from benchmarks.memory import _memory_child; "
        f"_memory_child({method!r}, {divergence!r}, {delta!r}, {n}, {threads})"
    )
    # a fixed mmap threshold makes every large array fresh pages (glibc would otherwise reuse freed, already
    # resident heap memory and hide the allocation from VmHWM)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    row: dict[str, Any] = {"method": method, "divergence": divergence, "n_tokens": n}
    if proc.returncode != 0:
        row["error"] = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "subprocess failed"
        return row
    peak = json.loads(proc.stdout.strip().splitlines()[-1])["peak_extra_bytes"]
    input_bytes = 4 * n
    row.update(
        peak_extra_bytes=peak,
        input_bytes=input_bytes,
        peak_over_input=peak / input_bytes,
        peak_over_outputs=peak / (2 * input_bytes),
    )
    return row


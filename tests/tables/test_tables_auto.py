"""``BandTable(..., backend="auto")`` reads a CPU input with Numba once the lookup kernel for that size class,
dtype and output is ready (run in this process or cached on disk), and with NumPy on a cold cache below
``AUTO_NUMBA_MIN_SIZE`` tokens: a small lookup never waits for a compile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fresh import fresh_json

from bandcore import BandTable
from bandcore.kernels.lookup_drivers import lookup_ready

#: A small table call in a fresh process: whether Numba was imported, and the ratio bounds.
SMALL_CALL = """
import json, sys, numpy as np
from bandcore import BandTable
x = np.log(np.linspace(0.01, 0.9, 50)).astype(np.float32)
lower, upper = BandTable.shipped("kl", 0.05)(x{backend})
print(json.dumps(["numba" in sys.modules, lower.tolist(), upper.tolist()]))
"""


def _small_call(cache: Path, backend: str = "") -> list:
    return fresh_json(SMALL_CALL.format(backend=f", backend={backend!r}" if backend else ""), cache)


@pytest.mark.slow  # three fresh interpreters and one compile of the lookup kernel
def test_a_cold_process_reads_small_inputs_with_numpy_until_the_lookup_kernel_is_on_disk(tmp_path):
    cold = _small_call(tmp_path)
    assert cold[0] is False  # NumPy, and Numba not even imported: no compile
    compiled = _small_call(tmp_path, backend="numba")  # compiles the lookup kernel, cached on disk
    warm = _small_call(tmp_path)
    assert compiled[0] is True and warm[0] is True  # the next process's small call runs the cached kernel
    assert warm[1:] == compiled[1:] == cold[1:]  # one lookup source: the same bounds on every backend


def test_a_lookup_kernel_that_ran_here_is_picked_for_small_inputs():
    table = BandTable.shipped("kl", 0.05)
    x = np.log(np.linspace(0.01, 0.9, 64))
    expected = table.log(x, backend="numba")  # the serial float64 log kernel has run in this process
    assert lookup_ready(x.size, x.dtype, x.dtype, False)
    for a, b in zip(table.log(x), expected, strict=True):  # Numba's bits (NumPy's may differ in the last ulp)
        np.testing.assert_array_equal(a, b)

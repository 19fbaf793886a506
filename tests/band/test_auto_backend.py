"""``backend="auto"`` picks the fastest binding whose kernel is ready (compiled in this process or cached on disk):
a small call never waits for a compile, and is fast once a kernel is ready.  Which binding ran is read from the
kernels' one cache of bound solvers, not from timings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from fresh import fresh_json

import bandcore as bc
from bandcore.band import AUTO_NUMBA_MIN_SIZE

#: A small auto call in a fresh process: the backends bound, whether Numba was imported, the bounds.
SMALL_CALL = """
import json, sys, numpy as np, bandcore as bc
from bandcore.kernels.backends import CACHE
x = np.log(np.linspace(0.01, 0.9, 50))
lower, upper = bc.band_log(x, "kl", 0.05{backend})
bound = sorted({{key[3] for key in CACHE.keys() if key[0] == "solver"}})
print(json.dumps([bound, "numba" in sys.modules, lower.tolist(), upper.tolist()]))
"""


def _small_call(cache: Path, backend: str = "") -> list:
    return fresh_json(SMALL_CALL.format(backend=f", backend={backend!r}" if backend else ""), cache)


def test_a_cold_process_runs_small_calls_on_numpy_until_the_numba_kernel_is_on_disk(tmp_path):
    cold = _small_call(tmp_path)
    assert cold[:2] == [["numpy"], False]  # NumPy, and Numba not even imported: no compile
    compiled = _small_call(tmp_path, backend="numba")  # compiles the kernel, cached on disk
    assert compiled[:2] == [["numba"], True]
    warm = _small_call(tmp_path)
    assert warm[:2] == [["numba"], True]  # the next process's small call runs the cached kernel
    # Numba's freshly compiled code and the code it loads from its cache may differ in the last bits (both within
    # the contract, checked against the oracle elsewhere): same bounds to 1e-13
    np.testing.assert_allclose(np.array(warm[2:]), np.array(compiled[2:]), rtol=1e-13, atol=0)


def test_auto_follows_the_kernels_that_ran_in_this_process():
    bound = bc.bind("hellinger", 0.05)
    big = np.full(AUTO_NUMBA_MIN_SIZE, -0.5)
    assert bound.pick(big.size) == "numba"  # a compile pays off at this size
    small = np.log(np.linspace(0.01, 0.9, 64))
    bc.band_log(small, "hellinger", 0.05, backend="numba")  # the serial float64 log kernel has run
    assert bound.pick(small.size, np.float64) == "numba"
    got = bound(small)
    expected = bc.band_log(small, "hellinger", 0.05, backend="numba")
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)
    torch_on_accelerator = bound.pick(small.size, np.float64, accelerator=True)
    assert torch_on_accelerator == "torch"
    assert bc.bind("hellinger", 0.05, backend="numpy").pick(big.size) == "numpy"  # a named backend is kept


#: A torch call on the CPU in a fresh process, on tokens the seeded pass leaves (p below e^-704, 1 - p below
#: e^-700): how many it left, whether Numba was imported, the bounds, NumPy's bounds.
TORCH_LEFTOVERS = """
import json, sys, numpy as np, torch, bandcore as bc
from bandcore.kernels.backends import CACHE
x = np.array([-745.0, -5000.0, -1e-300, -1e-305, -0.5, -3.0])
solver = bc.bind("hellinger", 0.05, backend="torch").solver("torch")
left = int((solver.pure(torch.from_numpy(x), fallback=False)[2] == int(bc.Status.NOT_CONVERGED)).sum())
lower, upper = bc.band_log(torch.from_numpy(x), "hellinger", 0.05, backend="torch")
{compile}
ref_lower, ref_upper = bc.band_log(x, "hellinger", 0.05, backend="numpy")
print(json.dumps([left, "numba" in sys.modules, lower.tolist(), upper.tolist(), ref_lower.tolist(),
                  ref_upper.tolist()]))
"""


def test_torch_on_the_cpu_solves_a_few_leftover_tokens_itself_until_the_numba_kernel_is_on_disk(tmp_path):
    """The tokens torch's seeded pass leaves go to the Numba kernel of the same plan only once it is ready (or
    from AUTO_NUMBA_MIN_SIZE of them): a cold process's first torch call compiles nothing."""

    def run(compile_numba: bool) -> list:
        line = 'bc.band_log(x[[0, 1, 2, 3]], "hellinger", 0.05, backend="numba")' if compile_numba else ""
        return fresh_json(TORCH_LEFTOVERS.format(compile=line), tmp_path)

    cold = run(False)
    assert cold[0] == 4 and cold[1] is False  # four tokens left by the seeded pass, solved without Numba
    for got, want in ((cold[2], cold[4]), (cold[3], cold[5])):  # the contract's measure; -inf exactly
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    run(True)  # the serial kernel for four float64 tokens is compiled, cached on disk
    warm = run(False)
    assert warm[0] == 4 and warm[1] is True  # the next process sends them to the cached kernel
    for got, want in ((warm[2], cold[2]), (warm[3], cold[3])):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)

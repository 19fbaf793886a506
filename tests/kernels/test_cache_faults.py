"""The one cache (generated kernels, plans, seed tables) survives faults: an unwritable location, damaged or
partial entries, concurrent writers — with the same bounds every time."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fresh import fresh_env, fresh_json

import bandcore as bc
from bandcore import _cache
from bandcore._cache import CacheWarning
from bandcore.kernels import compiled, sources

USER = "(u-1)**4 + abs(u-1)**1.5"

#: Bounds of one formula on given backends in a fresh process, with the warnings it raised.
BOUNDS = """
import json, warnings
import numpy as np, bandcore as bc
from bandcore._cache import CacheWarning
warnings.simplefilter("error")
x = -np.logspace(-12, np.log10(800.0), 300)
out = {{}}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", CacheWarning)
    for spelling, backend in {cases!r}:
        lower, upper = bc.band_log(x, spelling, 0.05, backend=backend)
        out[spelling + "|" + backend] = [lower.tolist(), upper.tolist()]
import sys
from numba.core.dispatcher import Dispatcher
compiled = sum(sum(f.stats.cache_misses.values()) for name, m in list(sys.modules.items())
               if name.startswith("bandcore_numba_") for f in vars(m).values() if isinstance(f, Dispatcher))
print(json.dumps([out, [str(w.message) for w in caught if issubclass(w.category, CacheWarning)], compiled]))
"""


def _bounds(cache: Path, cases: list[tuple[str, str]]) -> tuple[dict, list[str]]:
    out, warned, _ = fresh_json(BOUNDS.format(cases=cases), cache)
    return out, warned


def _assert_same(got: dict, expected: dict) -> None:
    """The same bounds: bit for bit from NumPy; from Numba to 1e-13, as the code Numba compiles and the code it
    loads from its cache may differ in the last bits (both within the contract, checked against the oracle)."""
    assert got.keys() == expected.keys()
    for key, (lower, upper) in got.items():
        for a, b in ((lower, expected[key][0]), (upper, expected[key][1])):
            if key.endswith("|numba"):
                np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-13, atol=0, err_msg=key)
            else:
                np.testing.assert_array_equal(np.array(a), np.array(b), err_msg=key)


def _reference(cases: list[tuple[str, str]]) -> dict:
    x = -np.logspace(-12, np.log10(800.0), 300)
    out = {}
    for spelling, backend in cases:
        lower, upper = bc.band_log(x, spelling, 0.05, backend=backend)
        out[f"{spelling}|{backend}"] = [lower.tolist(), upper.tolist()]
    return out


def test_an_unwritable_location_falls_back_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("BANDCORE_CACHE", str(blocker / "cache"))  # a path under a file: unwritable even for root
    with pytest.warns(CacheWarning, match="BANDCORE_CACHE") as caught:
        first = _cache.write_atomic("plans", "one.json", b"{}")
        second = _cache.write_atomic("seeds", "two.npz", b"\0")
    assert len(caught) == 1
    assert first.parent.parent == second.parent.parent == _cache.cache_root() != blocker / "cache"
    assert _cache.read_bytes("plans", "one.json") == b"{}"
    assert not [p for p in first.parent.iterdir() if p.suffix == ".tmp"]  # no temporary file left behind


CASES = [(USER, "numpy"), ("kl", "numba")]


@pytest.mark.slow
def test_an_unwritable_cache_gives_the_same_bounds_with_one_warning(tmp_path):
    """Plans, seeds and a compiled kernel, all made in the temporary fallback of a process whose cache location
    is unwritable; one warning names BANDCORE_CACHE."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    out, warned = _bounds(blocker / "cache", CASES)
    _assert_same(out, _reference(CASES))
    assert len(warned) == 1 and "BANDCORE_CACHE" in warned[0], warned


def test_a_read_only_cache_gives_the_same_bounds_with_one_warning(tmp_path):
    read_only = tmp_path / "read_only"
    read_only.mkdir()
    read_only.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)  # 555
    try:
        if os.access(read_only, os.W_OK):
            pytest.skip("this user writes into a mode-555 directory (root): the path-under-a-file tests cover it")
        cases = [(USER, "numpy")]
        out, warned = _bounds(read_only, cases)
        _assert_same(out, _reference(cases))
        assert len(warned) == 1 and "BANDCORE_CACHE" in warned[0], warned
    finally:
        read_only.chmod(stat.S_IRWXU)


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if how == "truncate" else b"\x80\x04garbage" + data[::7][:64])


@pytest.mark.parametrize("how", ["truncate", "garbage"])
def test_damaged_plan_and_seed_files_are_rebuilt(tmp_path, how):
    cases = [(USER, "numpy")]
    expected, _ = _bounds(tmp_path, cases)
    files = [*(tmp_path / "plans").glob("*.json"), *(tmp_path / "seeds").glob("*.npz")]
    assert {p.suffix for p in files} == {".json", ".npz"}
    originals = {p: p.read_bytes() for p in files}
    for path in files:
        _damage(path, how)
    again, warned = _bounds(tmp_path, cases)
    _assert_same(again, expected)
    assert not warned
    for path, original in originals.items():  # written again, whole
        assert path.read_bytes() == original, path.name


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ["*.py", "__pycache__/*.nbi", "__pycache__/*.nbc"])
def test_damaged_kernel_files_are_rebuilt(tmp_path, pattern):
    """A truncated generated module, and damaged Numba cache index / data files (which end in UnpicklingError
    when read as they are): detected on the first call, rebuilt, same bounds."""
    cases = [("kl", "numba")]
    expected, _ = _bounds(tmp_path, cases)
    files = list((tmp_path / "numba").glob(pattern))
    assert files, pattern
    for path in files:
        _damage(path, "truncate" if path.suffix == ".py" else "garbage")
    again, warned = _bounds(tmp_path, cases)
    _assert_same(again, expected)
    assert not warned
    third, _ = _bounds(tmp_path, cases)  # and the rebuilt files serve the next process
    _assert_same(third, expected)


@pytest.mark.slow
def test_processes_starting_at_once_on_an_empty_cache_agree(tmp_path):
    """Four processes on one empty cache: the same bounds, every write whole, and the Numba kernel compiled by one
    of them (the others wait for its lock and load the machine code it cached)."""
    cases = [(USER, "numpy"), ("kl", "numba")]
    script = BOUNDS.format(cases=cases)
    runs = [subprocess.Popen([sys.executable, "-c", script], env=fresh_env(tmp_path), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(4)]  # fmt: skip
    results = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=900)
        assert run.returncode == 0, stderr[-4000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    expected = _reference(cases)
    for out, warned, _ in results:
        _assert_same(out, expected)
        assert not warned
    assert sorted(compiled > 0 for _, _, compiled in results) == [False, False, False, True]
    assert not [p for p in tmp_path.rglob("*.tmp")]  # every write completed or cleaned up
    after, _ = _bounds(tmp_path, cases)  # what they left is whole
    _assert_same(after, expected)


def test_numba_cache_files_of_a_module_are_found():
    """Deleting a module's damaged Numba files relies on the dispatchers' cache folder (private in Numba)."""
    from bandcore.derive import solver_plan

    solver = bc.bind("kl", 0.05, backend="numba")
    solver(np.array([-0.5, -2.0]))
    module = compiled.numba_module(solver_plan(bc.resolve("kl")))
    assert getattr(module.band_kernel_log_serial, "_cache", None) is not None
    assert Path(module.band_kernel_log_serial._cache.cache_path).is_dir()
    found = sources._numba_files(module)
    assert any(p.suffix == ".nbi" for p in found) and any(p.suffix == ".nbc" for p in found)
    assert all(p.name.startswith(Path(module.__file__).stem + ".") for p in found)


def test_a_held_lock_makes_others_wait_then_go_on_without_it(tmp_path, monkeypatch):
    """exclusive(): a second holder waits while the first holds the lock, and after its wait runs without it
    (a lock only saves duplicate work); once released, the lock is free again."""
    import time

    monkeypatch.setenv("BANDCORE_CACHE", str(tmp_path))
    with _cache.exclusive("numba", "k.lock") as first:
        assert first is True
        start = time.monotonic()
        with _cache.exclusive("numba", "k.lock", wait=0.3) as second:
            assert second is False
        assert time.monotonic() - start >= 0.3
    with _cache.exclusive("numba", "k.lock", wait=0.0) as again:
        assert again is True

"""A table build depends on its inputs only: the same file bytes twice in a process and in a fresh process with one
Numba thread (no clock, no package version, no thread count in the result)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bandcore import BandTable
from bandcore.tables.formats import read_table
from bandcore.tables.tabulated import BUILDER, certificate

CASE = ("lecam", 0.05)  # saturates on both sides; one of the builds that used to fail
BUILD = """
import sys
from bandcore import BandTable
BandTable.build({name!r}, {delta!r}).save(sys.argv[1])
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("determinism")
    out = {}
    for run in ("first", "second"):
        out[run] = BandTable.build(*CASE).save(directory / f"{run}.npz")
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    out["one thread"] = directory / "one_thread.npz"
    code = BUILD.format(name=CASE[0], delta=CASE[1])
    subprocess.run([sys.executable, "-c", code, str(out["one thread"])], env=env, check=True, timeout=600)
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_bytes_in_process_and_with_one_thread(files):
    digests = {run: _sha(path) for run, path in files.items()}
    assert len(set(digests.values())) == 1, digests
    checksums = {read_table(path)[1]["checksum"] for path in files.values()}
    assert len(checksums) == 1


def test_metadata_names_the_builder_not_the_package(files):
    from bandcore import __version__

    _, meta = read_table(files["first"])
    assert meta["builder"] == BUILDER
    assert "bandcore_version" not in meta and __version__ not in str(meta)


@pytest.mark.parametrize(("measured", "expected"), [(4.43e-8, 5.54e-8), (4.4298154e-8, 5.54e-8), (8e-8, 1e-7),
                                                     (3.2e-6, 4e-6), (0.0, 0.0)])  # fmt: skip
def test_certificate_rounds_up_to_three_digits(measured, expected):
    assert certificate(measured) == expected
    assert certificate(measured) >= 1.25 * measured


#: a saturating user generator over a small delta range: split at L*(delta) on both sides (one delta-piece each)
CASE_2D = ("(sqrt(u) - 1)**2 + (u - 1)**2/4", (0.05, 0.052), 1e-6)
BUILD_2D = """
import sys
from bandcore.tables import BandTable2D
BandTable2D.build({formula!r}, {delta_range!r}, target={target!r}).save(sys.argv[1])
"""


@pytest.mark.slow  # ~45 s: two small builds
def test_saturating_2d_user_generator_builds_the_same_with_one_thread(tmp_path):
    """The thresholds, the 50-digit near solves and the delta-pieces depend on the inputs only; the table (a
    user generator saturating on both sides) is within its certificate against the oracle, next to both
    thresholds included."""
    from bandcore.oracle import reference_band_log
    from bandcore.tables import BandTable2D, rel_log_error

    formula, delta_range, target = CASE_2D
    table = BandTable2D.build(formula, delta_range, target=target)
    first = table.save(tmp_path / "first.npz")
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    code = BUILD_2D.format(formula=formula, delta_range=delta_range, target=target)
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "one.npz")], env=env, check=True, timeout=600)
    assert _sha(first) == _sha(tmp_path / "one.npz")
    assert 0 < table.max_rel_error <= target
    delta = 0.0511
    one = table.at(delta)
    lo_star, up_star = one.lower.threshold, one.upper.threshold
    L = np.array([1e-300, 1e-6, 0.3, 30.0, 700.0, lo_star * (1 - 1e-12), np.nextafter(lo_star, 0.0),
                  up_star * (1 + 1e-12), np.nextafter(up_star, 1.0)])  # fmt: skip
    for approx, ref in zip(table.log(-L, delta), reference_band_log(table.divergence, -L, delta), strict=True):
        assert rel_log_error(approx, ref).max() <= table.max_rel_error

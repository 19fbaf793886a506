"""A table build depends on its inputs only: the same file bytes twice in a process and in a fresh process with one
Numba thread (no clock, no package version, no thread count in the result)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bandcore import BandTable
from bandcore.tables.bounds import BUILDER, certificate
from bandcore.tables.formats import read_table

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


CASE_2D = ("hellinger", (0.05, 0.055), 1e-5)  # saturating on both sides: split at L*(delta), lower delta-pieces
BUILD_2D = """
import sys
from bandcore.tables import BandTable2D
BandTable2D.build({name!r}, {delta_range!r}, target={target!r}).save(sys.argv[1])
"""


@pytest.mark.slow  # ~30 s: two small builds
def test_saturating_2d_build_is_the_same_with_one_thread(tmp_path):
    """The thresholds, the 50-digit near solves and the delta-pieces depend on the inputs only."""
    from bandcore.tables import BandTable2D

    name, delta_range, target = CASE_2D
    first = BandTable2D.build(name, delta_range, target=target).save(tmp_path / "first.npz")
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    code = BUILD_2D.format(name=name, delta_range=delta_range, target=target)
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "one.npz")], env=env, check=True, timeout=600)
    assert _sha(first) == _sha(tmp_path / "one.npz")

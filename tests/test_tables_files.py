"""Table files: every format round-trips; damaged, wrong-version and pickled files are refused; shipped tables
are fresh; the ``bandcore table`` CLI."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from bandcore import BandTable
from bandcore.cli import main
from bandcore.table_cli import SHIPPED, check_shipped
from bandcore.table_formats import SUFFIXES, TableFileError, checksum
from bandcore.tables import SHIPPED_DIR

LOG_P = np.concatenate([-np.logspace(-12, 2.8, 300), [0.0, -1e-300, -700.0]])


@pytest.fixture(scope="module")
def tv_table() -> BandTable:
    return BandTable.shipped("tv", 0.05)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_round_trip_every_format(tmp_path, tv_table, suffix):
    path = tv_table.save(tmp_path / f"t{suffix}")
    loaded = BandTable.load(path)
    for a, b in zip(tv_table.to_arrays()[0].values(), loaded.to_arrays()[0].values(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert loaded.to_arrays()[1] == tv_table.to_arrays()[1]
    for a, b in zip(tv_table.log(LOG_P), loaded.log(LOG_P), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("suffix", [".npz", ".json", ".safetensors"])
def test_round_trip_2d(tmp_path, suffix):
    table = BandTable.shipped("kl", (0.01, 0.2))
    loaded = BandTable.load(table.save(tmp_path / f"t2{suffix}"))
    for a, b in zip(table.log(LOG_P, 0.07), loaded.log(LOG_P, 0.07), strict=True):
        np.testing.assert_array_equal(a, b)


def test_truncated_files_are_refused(tmp_path, tv_table):
    for suffix in SUFFIXES:
        path = tv_table.save(tmp_path / f"t{suffix}")
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        with pytest.raises(TableFileError, match=r"truncated or corrupted|checksum|lacks|not a bandcore"):
            BandTable.load(path)


def test_corrupted_value_fails_the_checksum(tmp_path, tv_table):
    path = tv_table.save(tmp_path / "t.json")
    body = json.loads(path.read_text())
    body["arrays"]["upper_values"][10] *= 1 + 1e-12
    path.write_text(json.dumps(body))
    with pytest.raises(TableFileError, match="checksum"):
        BandTable.load(path)
    path = tv_table.save(tmp_path / "t.csv")
    path.write_text(path.read_text().replace('"tv"', '"pearson"', 1))
    with pytest.raises(TableFileError, match="checksum"):
        BandTable.load(path)


def test_wrong_version_is_refused(tmp_path, tv_table):
    path = tv_table.save(tmp_path / "t.json")
    body = json.loads(path.read_text())
    body["metadata"]["format_version"] = 99
    arrays = {k: np.asarray(v) for k, v in body["arrays"].items()}
    body["metadata"]["checksum"] = checksum(arrays, body["metadata"])  # a consistent file of another version
    path.write_text(json.dumps(body))
    with pytest.raises(TableFileError, match="format version 99"):
        BandTable.load(path)


def test_pickled_npz_is_refused_without_unpickling(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, lower_knots=np.array([object()], dtype=object))
    with pytest.raises(TableFileError, match="truncated or corrupted"):
        BandTable.load(path)
    with zipfile.ZipFile(path) as z:  # it really holds a pickle
        assert b"\x80" in z.read("lower_knots.npy")


def test_missing_and_foreign_files(tmp_path):
    with pytest.raises(FileNotFoundError):
        BandTable.load(tmp_path / "nope.npz")
    foreign = tmp_path / "x.npz"
    np.savez(foreign, a=np.zeros(3))
    with pytest.raises(TableFileError):
        BandTable.load(foreign)
    with pytest.raises(ValueError, match="must end in"):
        BandTable.shipped("kl", 0.05).save(tmp_path / "t.pkl")


def test_shipped_tables_are_fresh_and_small():
    assert check_shipped() == []
    manifest = json.loads((SHIPPED_DIR / "manifest.json").read_text())
    assert len(manifest["tables"]) == len(SHIPPED)
    for entry in manifest["tables"]:
        size = (SHIPPED_DIR / entry["file"]).stat().st_size
        assert size == entry["bytes"]
        assert size < (80_000 if entry["table"] == "2d" else 20_000)


def test_stale_table_is_detected(tmp_path):
    for file in SHIPPED_DIR.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    table = BandTable.load(tmp_path / "kl_delta0.05.npz")
    table.upper.values[len(table.upper.values) // 2] += 1e-6  # e.g. built by an older, wrong solver
    table.save(tmp_path / "kl_delta0.05.npz")
    problems = check_shipped(tmp_path, knots_per_table=2000)
    assert any("kl_delta0.05.npz" in p for p in problems)


def test_cli_build_inspect_check(tmp_path, capsys):
    out = tmp_path / "tv.safetensors"
    assert main(["table", "build", "--divergence", "tv", "--delta", "0.3", "--out", str(out), "--quiet"]) == 0
    assert main(["table", "inspect", str(out)]) == 0
    assert "max_rel_error" in capsys.readouterr().out
    assert main(["table", "check", str(out), "--points", "5"]) == 0
    assert "within the certified" in capsys.readouterr().out
    assert main(["table", "build", "--divergence", "nope", "--delta", "0.3", "--out", str(out), "--quiet"]) == 2

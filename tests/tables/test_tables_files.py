"""Table files: every format round-trips; damaged, wrong-version and pickled files are refused; shipped tables
are fresh; the ``bandcore table`` CLI."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from bandcore import BandTable
from bandcore.cli import main
from bandcore.tables.formats import SHIPPED_DIR, SUFFIXES, TableFileError, checksum
from bandcore.tables.limits import MAX_OCTAVES, MAX_PIECES
from bandcore.tables.shipped import SHIPPED, check_shipped

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
        # Hellinger at 0.02: 1,421 knots, 25 KB; reverse_kl at 0.01: 2,495 knots (its left grid runs to 2^-1022), 43 KB
        # over delta: js 4 + 1 delta-pieces, 136 KB; reverse_kl 3 + 1 with logarithmic tails, 197 KB
        assert size < (210_000 if entry["table"] == "2d" else 50_000)


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


# ---- untrusted files: sizes checked before anything is allocated; labels checked against the contents --------


def _npz(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _npy(array) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _shipped_members(name="kl_delta0.05.npz") -> dict[str, bytes]:
    with zipfile.ZipFile(SHIPPED_DIR / name) as z:
        return {info.filename: z.read(info) for info in z.infolist()}


def _with(drop: str = "", **replace):
    return lambda path: _npz(path, {**{k: v for k, v in _shipped_members().items() if k != drop}, **replace})


def _huge_header(path):  # a header claiming 10^9 elements over 16 bytes of data: must not allocate 8 GB
    header = _npy(np.zeros(2))
    fake = header.replace(b"(2,)", b"(1000000000,)").replace(b" " * 9 + b"\n", b"\n", 1)
    return _npz(path, {**_shipped_members(), "lower_values.npy": fake})


def _relabelled(name: str, generator: str | None = None, **meta):
    """kl at 0.05, relabelled, with a freshly recomputed checksum (what an attacker or a careless tool writes)."""
    from bandcore.tables import write_table

    def make(path):
        arrays, metadata = BandTable.shipped("kl", 0.05).to_arrays()
        metadata = {**metadata, "divergence": name, **meta}
        if generator is not None:
            metadata["generator"] = generator
        return write_table(path, arrays, metadata)

    return make


def _near_knots(change):
    """tv at 0.05 (its lower bound is split at the threshold) with the near part's knots changed."""

    def make(path):
        from bandcore.tables import write_table

        arrays, metadata = BandTable.shipped("tv", 0.05).to_arrays()
        arrays["lower_near_knots"] = change(arrays["lower_near_knots"])
        return write_table(path, arrays, metadata)

    return make


def _near_meta(**meta):
    """tv at 0.05 (its split lower bound's near part stores H = r / lambda) with its metadata changed (None:
    the key dropped), the checksum recomputed."""

    def make(path):
        from bandcore.tables import write_table

        arrays, metadata = BandTable.shipped("tv", 0.05).to_arrays()
        metadata = {k: v for k, v in {**metadata, **meta}.items() if v is not None}
        return write_table(path, arrays, metadata)

    return make


def test_2d_levels_are_limited_by_the_pieces_a_table_may_hold(tmp_path):
    """A split 2-D bound stores the levels of each of its δ-pieces (reverse KL's lower bound: 3 pieces with
    logarithmic tails, 3,069 levels); beyond MAX_PIECES pieces of MAX_OCTAVES levels a file is refused."""
    from bandcore.tables import write_table

    assert len(BandTable.shipped("reverse_kl", (0.01, 0.2)).to_arrays()[0]["lower_levels"]) > MAX_OCTAVES
    arrays, metadata = BandTable.shipped("tv", (0.01, 0.2)).to_arrays()
    arrays["lower_levels"] = np.zeros(MAX_OCTAVES * MAX_PIECES + 1)
    path = write_table(tmp_path / "t.npz", arrays, metadata)
    with pytest.raises(TableFileError, match=r"lower_levels.* above the limit"):
        BandTable.load(path)


def _huge_levels(path):
    from bandcore.tables import write_table

    arrays, metadata = BandTable.shipped("kl", 0.05).to_arrays()
    arrays["lower_levels"] = np.full_like(arrays["lower_levels"], 23.0)  # 2^23 cells per octave: 8 GB of grid
    return write_table(path, arrays, metadata)


HOSTILE = [
    ("too many members", lambda p: _npz(p, {f"lower_knots{i}.npy": b"" for i in range(20)}), "more than a table holds"),
    ("unexpected member", _with("upper_slopes.npy", **{"x.pkl": b"\x80\x04junk"}), "unexpected member 'x.pkl'"),
    ("unexpected array", _with("upper_slopes.npy", **{"up.npy": _npy(np.zeros(3))}), "unexpected member 'up.npy'"),
    ("no metadata", lambda p: _npz(p, {"lower_knots.npy": _npy(np.zeros(3))}), "no metadata member"),
    ("too many knots", _with(**{"lower_knots.npy": _npy(np.arange(1.0, 30_002.0))}), "above the limit"),
    ("values longer than knots", _with(**{"lower_values.npy": _npy(np.zeros(5000))}), "above the limit"),
    ("too many levels", _with(**{"upper_levels.npy": _npy(np.zeros(MAX_OCTAVES + 70))}),
     f"above the limit of {MAX_OCTAVES}"),
    ("decompression bomb", _with(**{"lower_slopes.npy": _npy(np.zeros(4_000_000))}), "declares"),
    ("metadata bomb", _with(**{"__metadata__.npy": _npy(np.zeros(3 << 20, dtype=np.uint8))}), "declares"),
    ("header claims a huge shape", _huge_header, "has shape (1000000000,)"),
    ("levels describe a huge grid", _huge_levels, "levels describe a grid of"),
    ("catalogue name over another generator", _relabelled("pearson"), "labelled 'pearson'"),
    ("values of kl labelled pearson", _relabelled("pearson", "(u - 1)**2"), "does not hold the Band"),
    ("values of kl labelled delta 0.1", _relabelled("kl", delta=0.1), "does not hold the Band"),
    ("certificate above the target", _relabelled("kl", max_rel_error=1e-3), "certified error"),
    ("near knots not positive", _near_knots(lambda k: k - k[0]), "near knots must be positive"),
    ("near knots beyond the range", _near_knots(lambda k: k * (1e4 / k[-1])), "at most 680"),
    ("near knots NaN", _near_knots(lambda k: np.where(k == k[-1], np.nan, k)), "non-finite table entries"),
    ("near power 3", _near_meta(lower_near_power=3, lower_gamma=3.0), "lower_near_power must be one of [1, 2]"),
    ("near power a string", _near_meta(lower_near_power="1"), "got '1'"),
    ("near power a bool", _near_meta(lower_near_power=True), "got True"),
    ("near power not gamma", _near_meta(lower_near_power=2), "equal to gamma (1.0), got 2"),
    ("near power dropped", _near_meta(lower_near_power=None), "does not hold the Band"),
]


@pytest.mark.parametrize(("make", "fragment"), [pytest.param(m, f, id=i) for i, m, f in HOSTILE])
def test_hostile_file_is_refused(tmp_path, make, fragment):
    path = make(tmp_path / "t.npz")
    with pytest.raises(TableFileError) as info:
        BandTable.load(path)
    assert fragment in str(info.value)
    assert "t.npz" in str(info.value)


def test_relabelled_file_names_the_point(tmp_path):
    path = _relabelled("pearson", "(u - 1)**2")(tmp_path / "t.json")
    with pytest.raises(TableFileError, match=r"t\.json.*at log p = .*exact solver gives"):
        BandTable.load(path)


def test_shipped_refuses_a_file_for_another_divergence_or_delta(tmp_path, monkeypatch):
    import bandcore.tables.table as table_module

    for file in SHIPPED_DIR.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    (tmp_path / "kl_delta0.1.npz").write_bytes((SHIPPED_DIR / "kl_delta0.05.npz").read_bytes())
    (tmp_path / "pearson_delta0.05.npz").write_bytes((SHIPPED_DIR / "tv_delta0.05.npz").read_bytes())
    monkeypatch.setattr(table_module, "SHIPPED_DIR", tmp_path)
    with pytest.raises(TableFileError, match=r"not 'kl' at delta=0\.1"):
        BandTable.shipped("kl", 0.1)
    with pytest.raises(TableFileError, match=r"BandTable\('tv'.*not 'pearson'"):
        BandTable.shipped("bandchi2", 0.05)
    assert BandTable.shipped("bandkl", 0.05).delta == 0.05  # aliases resolve to the canonical file


def test_every_spelling_is_accepted(tmp_path):
    table = BandTable.build("alpha(0.5)", 0.1, target=1e-5)
    assert table.divergence.name == "alpha(0.5)" and table.max_rel_error <= 1e-5
    loaded = BandTable.load(table.save(tmp_path / "a.npz"))
    assert loaded.divergence == table.divergence
    out = tmp_path / "a.json"
    args = ["table", "build", "--divergence", "alpha(0.5)", "--delta", "0.1", "--target", "1e-5", "--quiet"]
    assert main([*args, "--out", str(out)]) == 0
    assert main(["table", "check", str(out), "--points", "3"]) == 0


def test_regenerate_never_replaces_a_users_file(tmp_path, capsys):
    (tmp_path / "kl_delta0.05.npz").write_bytes(b"mine")
    assert main(["table", "regenerate", "--dir", str(tmp_path), "--quiet"]) == 1
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "kl_delta0.05.npz").read_bytes() == b"mine"

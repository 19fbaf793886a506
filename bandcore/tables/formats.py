r"""Table files: ``.npz``, ``.safetensors``, ``.json`` and ``.csv``, all holding the same content.

A table is a set of named float64 arrays plus a metadata dictionary (JSON values).  Every file stores both and
a checksum,

.. math::  \mathrm{sha256}\big(\text{for each array, sorted by name: name, shape, little-endian float64
           bytes} \;\|\; \text{canonical JSON of the metadata without the checksum}\big),

so a reader in any language can verify it.

A table file is untrusted input.  :func:`read_table` refuses, with a :class:`TableFileError` naming the file,
before allocating anything large: a file above :data:`~.limits.MAX_FILE_BYTES`; an ``.npz`` with too many
members, a member that is not one of the table's arrays (never read), a member whose declared uncompressed size
or array shape exceeds what the metadata can legitimately need (:mod:`.limits`), or that holds Python objects
(``.npz`` members are parsed by hand, never unpickled); then a truncated or corrupted file, an unknown format
or format version, missing fields and a checksum mismatch.  What the arrays *mean* is checked by the table
classes (grid, kinds) and, on load, against the exact solver.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import re
import zipfile
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from .limits import MAX_FILE_BYTES, MAX_KNOTS, MAX_KNOTS_2D, MAX_METADATA_BYTES, MAX_NODES, MAX_OCTAVES, MAX_PIECES

__all__ = ["FORMAT", "FORMAT_VERSION", "SHIPPED_DIR", "SUFFIXES", "TableFileError", "array_limit", "checksum",
           "file_stem", "read_table", "shipped_name", "write_table"]  # fmt: skip

FORMAT = "bandcore-table"
FORMAT_VERSION = 2  # 2: tables in L = -log p on octave cells (1: x = logit p)
SUFFIXES = (".npz", ".safetensors", ".json", ".csv")
_METADATA_KEY = "__metadata__"
#: the package data folder holding the shipped tables and their manifest
SHIPPED_DIR = Path(str(files("bandcore.tables") / "data"))
_SIDES = ("lower", "upper")
ARRAYS = {
    "1d": tuple(f"{s}_{n}{k}" for s in _SIDES for n in ("", "near_") for k in ("knots", "values", "slopes", "levels")),
    "2d": tuple(f"{s}_{n}{k}" for s in _SIDES for n in ("", "near_")
                for k in ("knots", "levels", "coef_values", "coef_slopes")),
}
_NPY_HEADER_BYTES = 4096  # the .npy header of a float64 vector or matrix is 128 bytes


class TableFileError(ValueError):
    """A table file that cannot be trusted: truncated, corrupted, oversized, wrong version, or checksum mismatch."""


def file_stem(name: str) -> str:
    """A file-name-safe, unambiguous stem for a divergence name: catalogue names as they are (``kl``), α-family
    members without the parentheses (``alpha(0.5)`` → ``alpha0.5``, ``alpha(-1)`` → ``alpha-1``), anything else
    (a user formula such as ``u*log(u)/2``, which holds ``/`` and ``*``) as ``user-`` and 16 hex digits of its
    sha256.  The result holds only ``[a-z0-9._+-]``: no path separator, nothing a shell or Windows treats
    specially."""
    if re.fullmatch(r"[a-z][a-z_]*", name):
        return name
    match = re.fullmatch(r"alpha\((-?[0-9][0-9.e+-]*)\)", name)
    if match:
        return f"alpha{match.group(1)}"
    return "user-" + hashlib.sha256(name.encode()).hexdigest()[:16]


def shipped_name(name: str, delta: float | tuple[float, float]) -> str:
    """File name of a shipped table: ``kl_delta0.05.npz``, ``alpha0.5_delta0.05.npz``, ``kl_delta0.01-0.2.npz``
    (2-D); the divergence part is :func:`file_stem`."""
    if isinstance(delta, (tuple, list)):
        return f"{file_stem(name)}_delta{delta[0]:g}-{delta[1]:g}.npz"
    return f"{file_stem(name)}_delta{delta:g}.npz"


def array_limit(kind: Any, name: str, knots: int | None = None) -> int:
    """Most elements array ``name`` of a ``kind`` (``"1d"``/``"2d"``) table can need (``knots``: the length of
    that side's knots, when known); raises :class:`KeyError` for an array such a table does not hold."""
    if kind not in ARRAYS or name not in ARRAYS[kind]:
        raise KeyError(name)
    max_knots = MAX_KNOTS if kind == "1d" else MAX_KNOTS_2D
    field = name.split("_", 1)[1].removeprefix("near_")  # the near part of a bound split at its threshold
    if field == "levels":  # a 2-D bound split at its threshold stores the levels of each of its delta-pieces
        return MAX_OCTAVES * (MAX_PIECES if kind == "2d" else 1)
    if field.startswith("coef_"):
        return MAX_NODES * (max_knots if knots is None else min(knots, max_knots))
    return max_knots if knots is None or field == "knots" else min(knots, max_knots)


def knots_of(name: str) -> str:
    """The knots array that bounds the size of array ``name`` (``lower_near_values`` -> ``lower_near_knots``)."""
    side, field = name.split("_", 1)
    return f"{side}_near_knots" if field.startswith("near_") else f"{side}_knots"


def _canonical_metadata(metadata: dict[str, Any]) -> bytes:
    rest = {k: v for k, v in metadata.items() if k != "checksum"}
    return json.dumps(rest, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def checksum(arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> str:
    """sha256 hex digest over the canonical array bytes and metadata (see the module docstring)."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name], dtype="<f8")
        digest.update(name.encode() + b"\0" + json.dumps(list(a.shape)).encode() + b"\0" + a.tobytes())
    digest.update(_canonical_metadata(metadata))
    return digest.hexdigest()


def write_table(path: str | Path, arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> Path:
    """Write a table; the format follows the suffix (one of :data:`SUFFIXES`)."""
    path = Path(path)
    arrays = {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in arrays.items()}
    metadata = {**metadata, "format": FORMAT, "format_version": FORMAT_VERSION}
    metadata["checksum"] = checksum(arrays, metadata)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        meta = np.frombuffer(json.dumps(metadata, sort_keys=True).encode(), dtype=np.uint8)
        with path.open("wb") as fh:
            np.savez_compressed(fh, **arrays, **{_METADATA_KEY: meta})
    elif suffix == ".safetensors":
        from safetensors.numpy import save_file

        save_file(arrays, str(path), metadata={k: json.dumps(v) for k, v in metadata.items()})
    elif suffix == ".json":
        body = {"metadata": metadata, "arrays": {k: v.tolist() for k, v in arrays.items()}}
        path.write_text(json.dumps(body, indent=1, sort_keys=True, allow_nan=False) + "\n")
    elif suffix == ".csv":
        path.write_text(_to_csv(arrays, metadata))
    else:
        raise ValueError(f"table path {str(path)!r} must end in one of {', '.join(SUFFIXES)}")
    return path


def _to_csv(arrays: dict[str, np.ndarray], metadata: dict[str, Any]) -> str:
    out = io.StringIO()
    for key in sorted(metadata):
        out.write(f"# {key}={json.dumps(metadata[key])}\n")
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["array", "index", "value"])
    for name in sorted(arrays):
        for i, value in enumerate(arrays[name].ravel()):
            writer.writerow([name, i, repr(float(value))])
    return out.getvalue()


def _from_csv(text: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    metadata: dict[str, Any] = {}
    body = []
    for line in text.splitlines():
        if line.startswith("# "):
            key, _, value = line[2:].partition("=")
            metadata[key] = json.loads(value)
        else:
            body.append(line)
    rows = list(csv.reader(body))
    if not rows or rows[0] != ["array", "index", "value"]:
        raise ValueError("missing the 'array,index,value' header")
    columns: dict[str, list[float]] = {}
    kind = metadata.get("table")
    for row in rows[1:]:
        name, index, value = row
        column = columns.setdefault(name, [])
        if len(column) >= _limit(kind, name, None):
            raise TableFileError(f"array {name!r} is longer than a {kind} table can need")
        if int(index) != len(column):
            raise ValueError(f"array {name!r}: index {index} out of order")
        column.append(float(value))
    return {k: np.asarray(v, dtype=np.float64) for k, v in columns.items()}, metadata


def _limit(kind: Any, name: str, knots: int | None) -> int:
    try:
        return array_limit(kind, name, knots)
    except KeyError:
        raise TableFileError(f"unexpected array {name!r} for a table of kind {kind!r}") from None


def _read_npy(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, itemsize: int = 8) -> np.ndarray:
    """One ``.npy`` member of at most ``limit`` elements of ``itemsize`` bytes: the declared uncompressed size and
    the header are checked before the data is read; objects refused."""
    if info.file_size > _NPY_HEADER_BYTES + itemsize * limit:
        raise TableFileError(f"member {info.filename!r} declares {info.file_size:,} bytes, above the limit")
    with zf.open(info) as fh:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        if dtype.hasobject:
            raise ValueError(f"member {info.filename!r} holds Python objects (refused: never unpickled)")
        count = int(np.prod(shape, dtype=np.int64))
        if len(shape) > 2 or count > limit or count * dtype.itemsize > info.file_size:
            raise TableFileError(f"member {info.filename!r} has shape {shape}, above the limit of {limit} elements")
        data = fh.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise ValueError(f"member {info.filename!r} is short")
    return np.frombuffer(bytearray(data), dtype=dtype).reshape(shape, order="F" if fortran else "C")


def _read_npz(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        if len(infos) > 1 + max(len(v) for v in ARRAYS.values()):
            raise TableFileError(f"has {len(infos)} members, more than a table holds")
        members = {}
        for info in infos:
            name = info.filename.removesuffix(".npy")
            if not info.filename.endswith(".npy") or (name != _METADATA_KEY and not any(name in v for v in
                                                                                          ARRAYS.values())):
                raise TableFileError(f"has an unexpected member {info.filename!r} (not read)")
            members[name] = info
        if _METADATA_KEY not in members:
            raise ValueError("no metadata member")
        raw = _read_npy(zf, members.pop(_METADATA_KEY), MAX_METADATA_BYTES, itemsize=1)
        metadata = json.loads(raw.tobytes().decode())
        kind = metadata.get("table") if isinstance(metadata, dict) else None
        arrays = {}
        for name in sorted(members, key=lambda n: not n.endswith("_knots")):  # knots first: they bound the rest
            knots = arrays.get(knots_of(name))
            limit = _limit(kind, name, None if knots is None else knots.size)
            arrays[name] = _read_npy(zf, members[name], limit)
    return arrays, metadata


def _read_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as fh:
        raw = fh.metadata() or {}
        metadata = {k: json.loads(v) for k, v in raw.items()}
        kind = metadata.get("table")
        for name in fh.keys():
            size = int(np.prod(fh.get_slice(name).get_shape(), dtype=np.int64))
            if size > _limit(kind, name, None):
                raise TableFileError(f"array {name!r} has {size} elements, above the limit")
        arrays = {k: fh.get_tensor(k) for k in fh.keys()}
    return arrays, metadata


def _read_raw(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise TableFileError(f"table file {str(path)!r} must end in one of {', '.join(SUFFIXES)}")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise TableFileError(f"is {size:,} bytes, above the limit of {MAX_FILE_BYTES:,} for a table file")
    if suffix == ".npz":
        return _read_npz(path)
    if suffix == ".safetensors":
        return _read_safetensors(path)
    if suffix == ".json":
        body = json.loads(path.read_text())
        kind = body["metadata"].get("table")
        for name, values in body["arrays"].items():
            if len(values) > _limit(kind, name, None):
                raise TableFileError(f"array {name!r} is longer than a {kind} table can need")
        return {k: np.asarray(v, dtype=np.float64) for k, v in body["arrays"].items()}, body["metadata"]
    return _from_csv(path.read_text())


def read_table(path: str | Path, required: tuple[str, ...] = ()) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read and verify a table file; returns (float64 arrays, metadata)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no table file at {str(path)!r}")
    try:
        arrays, metadata = _read_raw(path)
    except TableFileError as err:
        raise TableFileError(f"{str(path)!r} {err}" if not str(err).startswith("table file") else str(err)) from None
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as err:
        raise TableFileError(f"{str(path)!r} is truncated or corrupted: {type(err).__name__}: {err}") from None
    except Exception as err:  # safetensors raises its own SafetensorError for a damaged header
        raise TableFileError(f"{str(path)!r} is truncated or corrupted: {type(err).__name__}: {err}") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        found = metadata.get("format") if isinstance(metadata, dict) else None
        raise TableFileError(f"{str(path)!r} is not a bandcore table (format {found!r})")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise TableFileError(
            f"{str(path)!r} has table format version {metadata.get('format_version')!r}; "
            f"this bandcore reads version {FORMAT_VERSION}: rebuild it with `bandcore table build`"
        )
    missing = [k for k in required if k not in metadata and k not in arrays]
    if missing:
        raise TableFileError(f"{str(path)!r} lacks required fields {missing}")
    try:
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    except (TypeError, ValueError) as err:
        raise TableFileError(f"{str(path)!r} holds non-numeric table entries: {err}") from None
    if any(not np.all(np.isfinite(v)) for v in arrays.values()):
        raise TableFileError(f"{str(path)!r} holds non-finite table entries")
    expected = checksum(arrays, metadata)
    if metadata.get("checksum") != expected:
        raise TableFileError(
            f"{str(path)!r} fails its checksum (stored {metadata.get('checksum')!r}, computed {expected!r}): "
            "the file was modified or damaged"
        )
    return arrays, metadata

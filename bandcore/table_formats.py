r"""Table files: ``.npz``, ``.safetensors``, ``.json`` and ``.csv``, all holding the same content.

A table is a set of named float64 arrays plus a metadata dictionary (JSON values).  Every file stores both and
a checksum,

.. math::  \mathrm{sha256}\big(\text{for each array, sorted by name: name, shape, little-endian float64
           bytes} \;\|\; \text{canonical JSON of the metadata without the checksum}\big),

so a reader in any language can verify it.  :func:`read_table` refuses a truncated or corrupted file, an
unknown format or format version, missing fields, and a checksum mismatch, with a :class:`TableFileError`
naming the file; ``.npz`` files are read with ``allow_pickle=False`` (the metadata is stored as UTF-8 bytes,
never as a Python object).
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FORMAT", "FORMAT_VERSION", "SUFFIXES", "TableFileError", "checksum", "read_table", "write_table"]

FORMAT = "bandcore-table"
FORMAT_VERSION = 2  # 2: tables in L = -log p on octave cells (1: x = logit p)
SUFFIXES = (".npz", ".safetensors", ".json", ".csv")
_METADATA_KEY = "__metadata__"


class TableFileError(ValueError):
    """A table file that cannot be trusted: truncated, corrupted, wrong version, or checksum mismatch."""


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
    lines = text.splitlines()
    body = []
    for line in lines:
        if line.startswith("# "):
            key, _, value = line[2:].partition("=")
            metadata[key] = json.loads(value)
        else:
            body.append(line)
    rows = list(csv.reader(body))
    if not rows or rows[0] != ["array", "index", "value"]:
        raise ValueError("missing the 'array,index,value' header")
    columns: dict[str, list[float]] = {}
    for row in rows[1:]:
        name, index, value = row
        column = columns.setdefault(name, [])
        if int(index) != len(column):
            raise ValueError(f"array {name!r}: index {index} out of order")
        column.append(float(value))
    return {k: np.asarray(v, dtype=np.float64) for k, v in columns.items()}, metadata


def _read_raw(path: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".npz":
        with path.open("rb") as fh, np.load(fh, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files if k != _METADATA_KEY}
            metadata = json.loads(data[_METADATA_KEY].tobytes().decode())
        return arrays, metadata
    if suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as fh:
            arrays = {k: fh.get_tensor(k) for k in fh.keys()}
            raw = fh.metadata() or {}
        return arrays, {k: json.loads(v) for k, v in raw.items()}
    if suffix == ".json":
        body = json.loads(path.read_text())
        return {k: np.asarray(v, dtype=np.float64) for k, v in body["arrays"].items()}, body["metadata"]
    if suffix == ".csv":
        return _from_csv(path.read_text())
    raise TableFileError(f"table file {str(path)!r} must end in one of {', '.join(SUFFIXES)}")


def read_table(path: str | Path, required: tuple[str, ...] = ()) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Read and verify a table file; returns (float64 arrays, metadata)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no table file at {str(path)!r}")
    try:
        arrays, metadata = _read_raw(path)
    except TableFileError:
        raise
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as err:
        raise TableFileError(f"{str(path)!r} is truncated or corrupted: {type(err).__name__}: {err}") from None
    except Exception as err:  # safetensors raises its own SafetensorError for a damaged header
        raise TableFileError(f"{str(path)!r} is truncated or corrupted: {type(err).__name__}: {err}") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise TableFileError(f"{str(path)!r} is not a bandcore table (format {metadata.get('format')!r})")
    if metadata.get("format_version") != FORMAT_VERSION:
        raise TableFileError(
            f"{str(path)!r} has table format version {metadata.get('format_version')!r}; "
            f"this bandcore reads version {FORMAT_VERSION}: rebuild it with `bandcore table build`"
        )
    missing = [k for k in required if k not in metadata and k not in arrays]
    if missing:
        raise TableFileError(f"{str(path)!r} lacks required fields {missing}")
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()}
    if any(not np.all(np.isfinite(v)) for v in arrays.values()):
        raise TableFileError(f"{str(path)!r} holds non-finite table entries")
    expected = checksum(arrays, metadata)
    if metadata.get("checksum") != expected:
        raise TableFileError(
            f"{str(path)!r} fails its checksum (stored {metadata.get('checksum')!r}, computed {expected!r}): "
            "the file was modified or damaged"
        )
    return arrays, metadata

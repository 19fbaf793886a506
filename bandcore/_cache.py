r"""The one on-disk cache: generated kernel modules, solver plans and seed tables, each a file in a folder of it.

Where: ``$BANDCORE_CACHE``, else ``$XDG_CACHE_HOME/bandcore``, else ``~/.cache/bandcore``; folders ``numba``
(generated modules, and Numba's machine code of them in its ``__pycache__``), ``plans`` (JSON), ``seeds`` (``.npz``).

Faults, each survived with the same bounds:

* **An unwritable location** (a read-only home or container, a path under a file): the first use finds it out
  (it creates the folder and a probe file), warns once with a :class:`CacheWarning` naming ``BANDCORE_CACHE``, and
  the process caches in a temporary directory of its own instead (removed at exit; a new process rebuilds).  A
  write that fails later (a full disk) switches to that directory the same way.
* **A damaged or partial entry** (a killed writer, a full disk, an edit): every reader checks what it reads (plans
  carry a digest, seed tables are zip files with checksums and known shapes, a generated module is compared with
  its source, Numba's own files are checked by loading them: :mod:`bandcore.kernels.compiled`) and rebuilds the
  entry when the check fails.
* **Concurrent writers** (several processes starting at once on an empty cache): every file is written to a
  temporary file in its own folder and moved into place with :func:`os.replace`, which is atomic, so a reader sees
  the old file or the new one, never half of one; writers of one entry write the same bytes.  An entry that is
  costly to build (a Numba compile) is built under :func:`exclusive`, so that the others wait and read it.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["CacheWarning", "cache_root", "configured_root", "exclusive", "read_bytes", "write_atomic"]


class CacheWarning(UserWarning):
    """bandcore's cache directory cannot be used; this process caches in a temporary directory instead."""


_LOCK = threading.Lock()
#: configured root -> the root this process uses for it (itself once probed, or a temporary directory)
_ROOTS: dict[Path, Path] = {}
#: the temporary directories of this process (removed at exit)
_TEMPORARY: list[tempfile.TemporaryDirectory] = []


def configured_root() -> Path:
    """The cache root the environment asks for: ``$BANDCORE_CACHE``, ``$XDG_CACHE_HOME/bandcore`` or
    ``~/.cache/bandcore``."""
    root = os.environ.get("BANDCORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "bandcore"
    )
    return Path(root)


def cache_root() -> Path:
    """The cache root this process writes to: :func:`configured_root` if it can, else a temporary directory (with
    one :class:`CacheWarning`)."""
    configured = configured_root()
    root = _ROOTS.get(configured)
    if root is not None:
        return root
    try:
        configured.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=configured, prefix=".probe-")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        return _fall_back(configured, error)
    with _LOCK:
        return _ROOTS.setdefault(configured, configured)


def _fall_back(configured: Path, error: OSError) -> Path:
    """A temporary root for ``configured`` (made once per process), announced by one warning."""
    with _LOCK:
        root = _ROOTS.get(configured)
        if root is not None and root != configured:
            return root
        directory = tempfile.TemporaryDirectory(prefix="bandcore-cache-", ignore_cleanup_errors=True)
        _TEMPORARY.append(directory)
        root = _ROOTS[configured] = Path(directory.name)
    reason = error.strerror or str(error)
    warnings.warn(
        f"bandcore cannot write its cache at {configured} ({reason}); this process caches in {root} instead, so "
        f"generated kernels, solver plans and seed tables are built again in every process.  Set BANDCORE_CACHE to "
        f"a writable directory to keep them.",
        CacheWarning,
        stacklevel=3,
    )
    return root


#: How long :func:`exclusive` waits for another process's lock before going on without it (seconds)
EXCLUSIVE_WAIT = 300.0


@contextmanager
def exclusive(folder: str, name: str, wait: float = EXCLUSIVE_WAIT) -> Iterator[bool]:
    """Hold the lock file ``cache_root()/folder/name`` exclusively across processes (POSIX ``flock``) for the
    body; yields whether it was held.  The kernel drops the lock when its holder exits, killed or not.  After
    ``wait`` seconds, where there is no ``flock`` (Windows) or the file cannot be opened, the body runs without
    it: a lock saves duplicate work only, so it never blocks a caller for good."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield False
        return
    try:
        directory = cache_root() / folder
        directory.mkdir(parents=True, exist_ok=True)
        handle = os.open(directory / name, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except OSError:
                if time.monotonic() >= deadline:
                    held = False
                    break
                time.sleep(0.02)
        yield held
    finally:
        os.close(handle)  # releases the lock


def write_atomic(folder: str, name: str, data: bytes) -> Path:
    """Write ``data`` to ``cache_root()/folder/name`` atomically (a temporary file in that folder, then
    :func:`os.replace`) and return the path; where that fails, in the temporary root (:func:`cache_root`).
    Raises :class:`OSError` only when the temporary root fails too."""
    try:
        return _write(cache_root() / folder, name, data)
    except OSError as error:
        configured = configured_root()
        if _ROOTS.get(configured) != configured:
            raise
        return _write(_fall_back(configured, error) / folder, name, data)


def _write(directory: Path, name: str, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, directory / name)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return directory / name


def read_bytes(folder: str, name: str) -> bytes | None:
    """The bytes of ``cache_root()/folder/name``, or None where it is missing or unreadable (the caller checks
    what it reads and rebuilds a damaged entry)."""
    try:
        return (cache_root() / folder / name).read_bytes()
    except OSError:
        return None

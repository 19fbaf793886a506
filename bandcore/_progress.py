"""The one progress bar of bandcore: a tqdm bar on stderr when stderr is a terminal, nothing otherwise.

Every long loop (``bandcore derive``, ``derivations``, ``verify``, ``bench``, the API calls behind them) goes
through :func:`progress`.  The decision is :func:`progress_enabled`: ``enabled=None`` (the default everywhere)
shows the bar only when stderr is a terminal, ``False`` never (``--quiet``), ``True`` always.  A disabled bar
is a silent stand-in with the same methods, so callers never branch on it.

This module imports nothing from bandcore (every layer may use it) and loads tqdm only when a bar is drawn.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Bar", "progress", "progress_enabled"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Bar(Protocol[T_co]):
    """What :func:`progress` returns: a tqdm bar or a silent stand-in (iterate it, or ``update`` it by hand)."""

    def __iter__(self) -> Iterator[T_co]: ...
    def update(self, n: float = 1) -> Any: ...
    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: ...
    def write(self, s: str) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> Bar[T_co]: ...
    def __exit__(self, *exc: object) -> None: ...


def progress_enabled(enabled: bool | None = None) -> bool:
    """Whether a bar is drawn: ``enabled`` if it is a bool, else whether stderr is a terminal."""
    if enabled is not None:
        return bool(enabled)
    stream = sys.stderr
    try:
        return stream is not None and not stream.closed and stream.isatty()
    except (AttributeError, ValueError):  # a replaced stream without isatty, or a closed file
        return False


class _Silent(Generic[T]):
    """A disabled bar: iterates its items, ignores updates, prints ``write`` to stdout."""

    def __init__(self, iterable: Iterable[T] | None) -> None:
        self._iterable = iterable

    def __iter__(self) -> Iterator[T]:
        return iter(() if self._iterable is None else self._iterable)

    def update(self, n: float = 1) -> None:
        return None

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        return None

    def write(self, s: str) -> None:
        print(s)

    def close(self) -> None:
        return None

    def __enter__(self) -> _Silent[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def progress(
    iterable: Iterable[T] | None = None,
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    enabled: bool | None = None,
) -> Bar[T]:
    """A progress bar over ``iterable`` (or one advanced by hand with ``update``) on stderr.

    Parameters
    ----------
    iterable : iterable, optional
        What to iterate; its ``len`` is the total unless ``total`` is given.
    total : int, optional
        The number of steps the bar counts to (shown as ``k/total``).
    desc, unit : str
        The bar's label and the name of one step.
    enabled : bool or None
        ``None``: draw the bar when stderr is a terminal; ``False``: never (``--quiet``); ``True``: always.

    Returns
    -------
    Bar
        A tqdm bar (``leave=False``: it disappears when closed; ``write`` prints to stdout above it) or a
        silent stand-in with the same methods.
        Use it as a context manager, or ``close()`` it, so that the terminal line is cleared.
    """
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if not progress_enabled(enabled):
        return _Silent(iterable)
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True)

r"""Time budgets for symbolic work: every SymPy call of the derivation runs under one, in any thread.

A generator is data from a user, and SymPy's ``solve``, ``simplify``, ``limit`` or ``factor`` can run for
minutes on an innocent-looking formula (``(u-1)**64 + exp(exp(u-1))``).  :func:`bounded` runs a call under a
time limit and returns ``None`` when the limit is exceeded, the call recursed too deeply, or SymPy gave up;
the caller then falls back (no closed form, a numeric threshold) and says so in its notes.  :func:`deadline`
adds an overall limit for a whole derivation: every :func:`bounded` call inside it gets at most the time left.

How a call is interrupted.  A watchdog thread raises :class:`BudgetExceeded` *in the thread that runs the call*
(CPython's ``PyThreadState_SetAsyncExc``), so budgets work off the main thread too (a web server, a thread
pool), where ``SIGALRM`` cannot be used.  The exception derives from :class:`BaseException`, so SymPy's own
``except Exception`` clauses cannot swallow it, and it is raised again every :data:`REPEAT_SECONDS` until the
call has returned.  The hand-over at the end of a call takes no lock in the interrupted thread: the watchdog
flags the moment it injects, the caller waits for that flag to drop and then clears any exception still
pending, so no exception escapes after the call.  Like a signal, the exception is delivered between Python
bytecodes: a single long C call (a huge integer product) is interrupted only when it returns.

The exception may also strike while the interpreter runs a finalizer, a weakref callback or a ``gc`` callback
in the interrupted thread.  There Python cannot propagate it and hands it to ``sys.unraisablehook`` ("Exception
ignored in ..."); the first budgeted call installs a filter in front of the hook that drops such a
:class:`BudgetExceeded` (the next repetition ends the call) and passes every other exception on unchanged.

On an interpreter without ``PyThreadState_SetAsyncExc`` the main thread falls back to ``SIGALRM``; elsewhere a
budgeted call is not run at all and :func:`bounded` returns ``None`` (:func:`available` tells which).
"""

from __future__ import annotations

import ctypes
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = [
    "REPEAT_SECONDS",
    "BudgetExceeded",
    "available",
    "bounded",
    "deadline",
    "expired",
    "remaining",
    "time_limit",
]

T = TypeVar("T")

#: After the first interruption the watchdog raises again at this interval until the call returns.
REPEAT_SECONDS = 0.05
#: The watchdog gives up after this many interruptions (a call that swallows them all runs on unbounded).
_MAX_REPEATS = 400

_SET_ASYNC_EXC = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)
_LOCAL = threading.local()


class BudgetExceeded(BaseException):
    """A budgeted call ran past its time limit (a :class:`BaseException`: ``except Exception`` does not catch it)."""


_HOOK_LOCK = threading.Lock()


def _drop_stray_interruptions() -> None:
    """Put a filter in front of ``sys.unraisablehook`` that drops a :class:`BudgetExceeded` raised where Python
    cannot propagate it (a finalizer, a gc callback); the filter is installed once per hook it wraps."""
    with _HOOK_LOCK:
        hook = sys.unraisablehook
        if getattr(hook, "_drops_budget_exceeded", False):
            return

        def filtered(unraisable: Any) -> None:
            if unraisable.exc_type is not BudgetExceeded:
                hook(unraisable)

        filtered._drops_budget_exceeded = True  # type: ignore[attr-defined]
        sys.unraisablehook = filtered


def available() -> bool:
    """True when a budgeted call can be interrupted in the current thread."""
    return _SET_ASYNC_EXC is not None or _signal_usable()


def _signal_usable() -> bool:
    return threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")


def _deadlines() -> list[float]:
    stack = getattr(_LOCAL, "deadlines", None)
    if stack is None:
        stack = _LOCAL.deadlines = []
    return stack


def remaining() -> float:
    """Seconds left of the innermost :func:`deadline` of this thread (``inf`` outside any)."""
    stack = _deadlines()
    return min(stack) - time.monotonic() if stack else math.inf


def expired() -> bool:
    """True once the overall :func:`deadline` of this thread has passed."""
    return remaining() <= 0


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """An overall limit: inside the block every :func:`bounded` call gets at most the time that is left."""
    stack = _deadlines()
    stack.append(time.monotonic() + seconds)
    try:
        yield
    finally:
        stack.pop()


class time_limit:
    """Raise :class:`BudgetExceeded` in the current thread once ``seconds`` (or the :func:`deadline`) pass.

    Raises :class:`BudgetExceeded` at entry when no time is left or when no interruption mechanism exists in
    this thread (see the module docstring).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = min(float(seconds), remaining())
        self._armed = False  # the block has started: the watchdog may interrupt it
        self._done = False  # the block has ended: the watchdog must not interrupt any more
        self._injecting = False
        self._fired = False
        self._stop = threading.Event()
        self._previous_handler: Any = None
        self._mode = ""

    def __enter__(self) -> time_limit:
        if not self.seconds > 0:
            raise BudgetExceeded
        if math.isinf(self.seconds):  # no limit at all: nothing to watch
            self._armed = True
            return self
        _drop_stray_interruptions()
        if _SET_ASYNC_EXC is not None:
            self._mode = "thread"
            self._target = threading.get_ident()
            threading.Thread(target=self._watch, name="bandcore-budget", daemon=True).start()
        elif _signal_usable():
            self._mode = "signal"
            self._previous_handler = signal.signal(signal.SIGALRM, _raise_budget_exceeded)
            signal.setitimer(signal.ITIMER_REAL, self.seconds, REPEAT_SECONDS)
        else:
            raise BudgetExceeded
        self._armed = True  # last statement: nothing of __enter__ runs after the first interruption
        return self

    def _watch(self) -> None:
        """The watchdog: wait, then raise in the target thread until the block has ended."""
        if self._stop.wait(self.seconds):
            return
        for _ in range(_MAX_REPEATS):
            self._injecting = True
            if self._done:
                self._injecting = False
                return
            if self._armed:
                _SET_ASYNC_EXC(ctypes.c_ulong(self._target), ctypes.py_object(BudgetExceeded))
                self._fired = True
            self._injecting = False
            if self._stop.wait(REPEAT_SECONDS):
                return

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> bool:
        if self._mode == "signal":
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous_handler)
            return False
        while True:  # an exception injected just now may arrive inside this loop: finish the hand-over anyway
            try:
                self._done = True
                while self._injecting:  # the watchdog is between its check of _done and its injection
                    time.sleep(0)
                if self._fired:
                    _SET_ASYNC_EXC(ctypes.c_ulong(self._target), None)  # clear one still pending
                break
            except BudgetExceeded:
                continue
        self._stop.set()
        return False


def _raise_budget_exceeded(signum: int, frame: Any) -> None:
    raise BudgetExceeded


#: What a budgeted call may raise that means "no answer" rather than a bug of ours.
_GIVE_UP = (
    BudgetExceeded,
    RecursionError,
    MemoryError,
    NotImplementedError,
    ValueError,
    TypeError,
    ZeroDivisionError,
    OverflowError,
    AttributeError,
    IndexError,
    KeyError,
)


def bounded(fn: Callable[[], T], seconds: float) -> T | None:
    """``fn()``, or ``None`` if it runs past ``seconds`` (or the :func:`deadline`), recurses too deeply, or
    SymPy gives up on it (``NotImplementedError``, ``PolynomialError``, ...)."""
    try:
        with time_limit(seconds):
            return fn()
    except _GIVE_UP:
        return None
    except Exception as err:  # SymPy's own errors (PolynomialError, CoercionFailed, ...) derive from Exception
        if type(err).__module__.startswith(("sympy", "mpmath")):
            return None
        raise

r"""The one place that checks arguments: δ, log-probability arrays, backends, errors and per-element status.

Every public entry point (``band``/``band_log``, tables, the RL loss, the CLI) calls these functions at its
boundary and nothing below re-validates.  Messages name the argument, echo the bad value and say what is
allowed.  This module imports NumPy only.

Per-element status codes (in the style of SciPy's element-wise root finders, :class:`Status`):

* ``CONVERGED`` (0): both bounds are roots of :math:`g_f(p, r) = \delta` to the fp64 contract;
* ``SATURATED`` (1): at least one bound sits on the simplex boundary (:math:`r_{up} = 1/p` or :math:`r_{lo} = 0`)
  and is exact, the other converged; also p = 1 and p = 0, whose bounds are exact by convention;
* ``NOT_CONVERGED`` (-2): the iteration budget ran out (never observed on the contract's domain; returned
  rather than hidden);
* ``INVALID_INPUT`` (-3): NaN, or log p above :data:`LOG_P_TOLERANCE` (the bounds are NaN).
"""

from __future__ import annotations

import math
import numbers
import sys
from enum import IntEnum
from typing import Any

import numpy as np

__all__ = [
    "BACKENDS",
    "DELTA_MAX",
    "DELTA_MIN",
    "LOG_P_TOLERANCE",
    "BandcoreError",
    "Status",
    "check_backend",
    "check_delta",
    "check_in_choices",
    "check_log_prob_array",
    "check_positive_int",
    "is_torch_tensor",
]

#: log p in (0, LOG_P_TOLERANCE] is rounding noise of a log-softmax and is read as 0 (p = 1); larger values are
#: an error (``check=True``) or give NaN with status ``INVALID_INPUT`` (``check=False``).
LOG_P_TOLERANCE = 1e-6

#: Accepted trust-region radii: 0 < δ <= DELTA_MAX (the accuracy contract is stated for δ in [1e-8, 10]).
DELTA_MIN = 0.0
DELTA_MAX = 1e3

#: Solver backends; "auto" picks the fastest correct one for the input.
BACKENDS = ("auto", "numpy", "numba", "torch")


class BandcoreError(Exception):
    """A failure that is not the caller's usage error (a missing file, an uncertifiable table, ...)."""


class Status(IntEnum):
    """Per-element outcome of a Band evaluation (see the module docstring)."""

    CONVERGED = 0
    SATURATED = 1
    NOT_CONVERGED = -2
    INVALID_INPUT = -3


def is_torch_tensor(x: Any) -> bool:
    """True for a ``torch.Tensor`` (without importing torch when nobody has)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _real_scalar(value: Any, name: str) -> float:
    if isinstance(value, bool) or isinstance(value, (str, bytes)):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0 and getattr(getattr(value, "dtype", None), "kind", "f") in "fiu":
        return float(value)  # 0-d ndarray / tensor
    raise TypeError(f"{name} must be a real number, got {value!r:.80} ({type(value).__name__})")


def check_delta(delta: Any, name: str = "delta") -> float:
    """δ as a float: a real number with ``0 < delta <= DELTA_MAX`` (NaN and ±inf refused)."""
    value = _real_scalar(delta, name)
    if not (math.isfinite(value) and DELTA_MIN < value <= DELTA_MAX):
        raise ValueError(f"{name} must be finite with 0 < {name} <= {DELTA_MAX:g}, got {name}={value!r}")
    return value


def check_positive_int(value: Any, name: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        upper = "" if maximum is None else f" and <= {maximum}"
        raise ValueError(f"{name} must be >= {minimum}{upper}, got {name}={value}")
    return value


def check_in_choices(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (strings), else a ValueError listing them."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {name}={value!r:.80}")
    return value


def check_backend(backend: Any) -> str:
    """One of :data:`BACKENDS`."""
    return check_in_choices(backend, "backend", BACKENDS)


def check_log_prob_array(old_log_prob: Any, name: str = "old_log_prob") -> Any:
    """A floating array of log-probabilities: a torch tensor passes through, anything else becomes an ndarray.

    Integer, boolean, complex and object dtypes raise :class:`TypeError` naming the dtype (a list of floats
    is fine).  Values are checked against :data:`LOG_P_TOLERANCE` by the caller (``check=True``), because for
    a tensor that costs a host synchronisation.
    """
    if is_torch_tensor(old_log_prob):
        if not old_log_prob.is_floating_point():
            raise TypeError(
                f"{name} must be a floating-point tensor (log-probabilities), got dtype {old_log_prob.dtype}"
            )
        return old_log_prob
    if isinstance(old_log_prob, (str, bytes, dict, set)):
        raise TypeError(f"{name} must be an array of log-probabilities, got {type(old_log_prob).__name__}")
    try:
        x = np.asarray(old_log_prob)
    except (ValueError, TypeError) as err:
        raise TypeError(f"{name} must be an array of log-probabilities: {err}") from None
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        raise TypeError(
            f"{name} must be a floating-point array (log-probabilities), got dtype {x.dtype} "
            f"(value {old_log_prob!r:.80})"
        )
    return x


def above_tolerance_error(count: int, example: float, name: str = "old_log_prob") -> ValueError:
    """The error for log-probabilities above :data:`LOG_P_TOLERANCE` (one message for every backend)."""
    return ValueError(
        f"{name} must be <= 0 (log-probabilities; up to {LOG_P_TOLERANCE:g} is read as 0), "
        f"got {count} value(s) above, e.g. {name}={example!r}"
    )

r"""The per-step bounds of a plug-in: :class:`BandBounds`, built once by :meth:`BandSettings.bounds_provider`.

It holds what must not be rebuilt every step: the resolved divergence, the shipped 2-D table when δ moves, the
step count and the controller's state.  Each call of :meth:`BandBounds.log_bounds` returns the per-token
:math:`(\log l, \log u)` at the anchor's log-probabilities for the radii of the current step:

- a constant δ: the exact solver (:func:`bandcore.band.band_log`, fp64 accuracy), as :func:`log_ratio_bounds`;
- a δ that moves (schedule or controller, rounded as :func:`bandcore.rl.schedule.used_delta` says): the shipped
  2-D table of the divergence (:class:`bandcore.tables.BandTable2D`, certified to about 1e-7 relative, read at
  that δ with no rebuild) where one exists and covers δ (δ ∈ [0.01, 0.2] for the 11 shipped divergences), the
  exact solver otherwise;
- ``method`` ``"clip"`` / ``"clip-higher"``: the fixed clip :math:`[1-\varepsilon, 1+\varepsilon_{high}]`.

``max_ratio`` caps :math:`u`.  Arrays may be NumPy arrays or torch tensors (returned in kind, shape, dtype and
device); :math:`\log p` above the tolerance and NaN give NaN bounds (the loss checks its inputs before).

The step: a host that knows the number of optimizer steps done sets it (:meth:`BandBounds.set_step`); one that
does not counts them (:meth:`BandBounds.advance`).  The controller is told each step's measured KL
(:meth:`BandBounds.record_kl`).  This module imports neither torch nor a trainer.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from bandcore._contract import LOG_P_TOLERANCE, check_positive_int, is_torch_tensor

from .schedule import KLController, scheduled_delta, used_delta
from .settings import BandSettings, check_divergence

__all__ = ["CLIP_HIGHER_EPS", "BandBounds", "band_log_bounds", "cap_upper", "fixed_log_bounds"]

#: clip-higher's default ε_high (DAPO).
CLIP_HIGHER_EPS = 0.28
#: The δ range of the shipped 2-D tables.
SHIPPED_2D_RANGE = (0.01, 0.2)


def fixed_log_bounds(old_log_prob: Any, eps_low: float, eps_high: float) -> tuple[Any, Any]:
    r"""Constant :math:`(\log(1-\varepsilon), \log(1+\varepsilon_{high}))` shaped like ``old_log_prob``; NaN
    where it is NaN or above the tolerance, as for the Band."""
    low, high = math.log1p(-eps_low), math.log1p(eps_high)
    if is_torch_tensor(old_log_prob):
        import torch

        invalid = torch.isnan(old_log_prob) | (old_log_prob > LOG_P_TOLERANCE)
        nan = torch.full_like(old_log_prob, math.nan)
        return torch.where(invalid, nan, low), torch.where(invalid, nan, high)
    import numpy as np

    x = np.asarray(old_log_prob, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        invalid = np.isnan(x) | (x > LOG_P_TOLERANCE)
    return np.where(invalid, np.nan, low), np.where(invalid, np.nan, high)


def cap_upper(log_upper: Any, max_ratio: float | None) -> Any:
    """:math:`\\min(\\log u, \\log` ``max_ratio``:math:`)` (NaN stays NaN)."""
    if max_ratio is None:
        return log_upper
    if is_torch_tensor(log_upper):
        import torch

        return torch.clamp(log_upper, max=math.log(max_ratio))
    import numpy as np

    return np.minimum(log_upper, math.log(max_ratio))


def band_log_bounds(old_log_prob: Any, divergence: Any, delta_low: float, delta_high: float,
                    table: Any = None) -> tuple[Any, Any]:
    r"""The Band's :math:`(\log r_{lo}(p, \delta_{low}), \log r_{up}(p, \delta_{high}))` of a resolved
    f-divergence (radii already mapped); from ``table`` (a :class:`BandTable2D`) where it covers the radius."""

    def one(delta: float) -> tuple[Any, Any]:
        if table is not None:
            lo, hi = table.delta_range
            if lo <= delta <= hi:
                return table.log(old_log_prob, delta)
        return bound_band(divergence, delta)(old_log_prob)

    if delta_low == delta_high:
        return one(delta_low)
    return one(delta_low)[0], one(delta_high)[1]


@lru_cache(maxsize=64)
def bound_band(divergence: Any, delta: float) -> Any:
    """The exact Band of ``divergence`` at ``delta``, resolved, planned and bound once (:func:`bandcore.bind`):
    a trainer's steps call the solver it made at start-up.  ``check=False``: no host synchronisation; (0, tol] is
    read as 0, above tol and NaN give NaN."""
    from bandcore.band import bind

    return bind(divergence, float(delta), check=False)


def _shipped_2d(divergence: Any) -> Any:
    """The shipped 2-D table of ``divergence`` over :data:`SHIPPED_2D_RANGE`, or None if none is shipped."""
    from bandcore.tables import BandTable

    try:
        return BandTable.shipped(divergence, SHIPPED_2D_RANGE)
    except FileNotFoundError:
        return None


class BandBounds:
    """Per-step bounds of one :class:`BandSettings` (module docstring)."""

    def __init__(self, settings: BandSettings) -> None:
        if not isinstance(settings, BandSettings):
            raise TypeError(f"settings must be a BandSettings, got {type(settings).__name__}")
        self.settings = settings
        self._step = 0
        low, _ = settings.radii
        self._band = settings.method == "band"
        self.divergence = check_divergence(settings.divergence, low) if self._band else None
        self._controller = None
        if settings.target_kl is not None:
            self._controller = KLController(low, settings.target_kl, settings.kl_rate, settings.delta_min,
                                            settings.delta_max)
        self.table = _shipped_2d(self.divergence) if self._band and settings.moving else None
        self._mapped: dict[float, float] = {}

    @property
    def step(self) -> int:
        """Optimizer steps done (the schedule's :math:`t`)."""
        return self._step

    def set_step(self, step: int) -> None:
        """Set the number of optimizer steps done (a host that counts them itself)."""
        self._step = check_positive_int(step, "step", minimum=0)

    def advance(self, count: int = 1) -> None:
        """``count`` more optimizer steps done (a host that does not count them)."""
        self._step += check_positive_int(count, "count", minimum=0)

    def record_kl(self, measured_kl: float) -> None:
        """Tell the controller the measured KL(π_old‖π) of the optimizer step just done (no-op without one)."""
        if self._controller is not None:
            self._controller.update(measured_kl)

    def radii(self) -> tuple[float, float]:
        """``(δ_low, δ_high)`` in use at the current step."""
        s = self.settings
        if self._controller is not None:
            delta = used_delta(self._controller.delta)
        elif s.delta_schedule != "constant":
            delta = used_delta(scheduled_delta(s.delta_schedule, self._step, s.radii[0], s.delta_end,
                                               s.delta_steps, s.delta_hold_steps))
        else:
            return s.radii
        return delta, delta

    @property
    def delta(self) -> float | None:
        """The δ in use when both radii are equal, else None."""
        low, high = self.radii()
        return low if low == high else None

    def metrics(self) -> dict[str, float]:
        """``{"delta": δ}`` (or ``{"delta_low": ..., "delta_high": ...}``) in use; empty for a fixed clip."""
        if not self._band:
            return {}
        low, high = self.radii()
        return {"delta": low} if low == high else {"delta_low": low, "delta_high": high}

    def _f_radius(self, delta: float) -> float:
        """δ of the f-divergence (a transform's radius is mapped once per value)."""
        if delta not in self._mapped:
            from bandcore.divergences import resolve_region

            if len(self._mapped) > 16:
                self._mapped.clear()
            self._mapped[delta] = resolve_region(self.settings.divergence, delta)[1]
        return self._mapped[delta]

    def log_bounds(self, anchor_log_prob: Any) -> tuple[Any, Any]:
        r"""Per-token :math:`(\log l, \log u)` at the anchor's log-probabilities, for the current step."""
        s = self.settings
        if self._band:
            low, high = self.radii()
            log_lower, log_upper = band_log_bounds(anchor_log_prob, self.divergence, self._f_radius(low),
                                                   self._f_radius(high), self.table)
        else:
            default_high = s.clip_eps if s.method == "clip" else CLIP_HIGHER_EPS
            eps_high = default_high if s.clip_eps_high is None else s.clip_eps_high
            log_lower, log_upper = fixed_log_bounds(anchor_log_prob, s.clip_eps, eps_high)
        return log_lower, cap_upper(log_upper, s.max_ratio)

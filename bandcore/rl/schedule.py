r"""Radii that move: schedules over the optimizer step, and the adaptive KL controller.

**Schedules.**  With :math:`\delta_0` = ``delta``, :math:`\delta_1` = ``delta_end``, :math:`S` =
``delta_steps``, :math:`H` = ``delta_hold_steps`` and :math:`t` the number of optimizer steps done,
:math:`\tau = \min(1, \max(0, t - H)/S)`:

- ``constant``: :math:`\delta_0`;
- ``linear``: :math:`\delta_0 + (\delta_1 - \delta_0)\,\tau`;
- ``cosine``: :math:`\delta_1 + (\delta_0 - \delta_1)\,(1 + \cos\pi\tau)/2`;
- ``exponential``: :math:`\delta_0\,(\delta_1/\delta_0)^{\tau}` (geometric);

so δ stays at :math:`\delta_0` for :math:`H` steps, reaches :math:`\delta_1` at :math:`t = H + S` and stays
there.

**Controller.**  After each optimizer step with a measured :math:`\widehat{KL} = \mathrm{mean}(r - 1 - \log r)`
(the non-negative k3 estimate of :math:`KL(\pi_{old}\|\pi)` over the step's tokens, :math:`r = \pi/\pi_{old}`)
and target :math:`KL^*`,

.. math::  \delta \leftarrow \operatorname{clip}\Bigl(\delta\,
           \exp\bigl(-\eta\,\operatorname{clip}(\log(\widehat{KL}/KL^*), -1, 1)\bigr),\
           \delta_{min},\ \delta_{max}\Bigr),

i.e. δ shrinks when the policy moved more than the target and grows when it moved less, by at most a factor
:math:`e^{\eta}` per step (η = ``kl_rate`` ≤ 1).  The new δ is non-increasing in :math:`\widehat{KL}` and
non-decreasing in the old δ, it equals the old one at :math:`\widehat{KL} = KL^*`, and it never leaves
:math:`[\delta_{min}, \delta_{max}]`.  :math:`\widehat{KL} = 0` (a step whose every ratio is exactly 1, such as the
first pass over a freshly generated batch) carries no information about the trust region: δ does not move.

**Rounding.**  A radius that moves is used rounded to three significant digits (:func:`used_delta`): consecutive
steps share it, so the bounds of one δ (a 1-D table sliced from the 2-D table, or the exact solver's seed table)
are reused instead of rebuilt, and a run touches at most 900 radii per decade.  The controller keeps its state
unrounded; the logged δ is the rounded one, the one in use.

No torch, no NumPy: plain floats.
"""

from __future__ import annotations

import math

__all__ = ["KLController", "scheduled_delta", "used_delta"]


def scheduled_delta(schedule: str, step: int, start: float, end: float | None = None, steps: int | None = None,
                    hold: int = 0) -> float:
    """δ of ``schedule`` after ``step`` optimizer steps (module docstring); settings already validated."""
    if schedule == "constant":
        return start
    tau = min(1.0, max(0, step - hold) / steps)
    if tau in (0.0, 1.0):  # the ends exactly
        return start if tau == 0.0 else end
    if schedule == "linear":
        return start + (end - start) * tau
    if schedule == "cosine":
        return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * tau))
    if schedule == "exponential":
        return start * (end / start) ** tau
    raise ValueError(f"unknown schedule {schedule!r}")


def used_delta(delta: float) -> float:
    """A moving δ as used: rounded to three significant digits (module docstring)."""
    return float(f"{delta:.3g}")


class KLController:
    """The adaptive radius (module docstring): :meth:`update` once per optimizer step with the measured KL."""

    def __init__(self, start: float, target_kl: float, rate: float, delta_min: float, delta_max: float) -> None:
        self.delta = float(start)
        self.target_kl = float(target_kl)
        self.rate = float(rate)
        self.delta_min, self.delta_max = float(delta_min), float(delta_max)

    def update(self, measured_kl: float) -> float:
        """Move δ for one optimizer step whose measured KL(π_old‖π) is ``measured_kl`` (≥ 0); returns δ.

        A NaN or negative measurement is refused (``ValueError``): it would move δ on a wrong number.
        """
        kl = float(measured_kl)
        if not kl >= 0:
            raise ValueError(f"the measured KL must be a number >= 0, got {measured_kl!r}")
        if kl == 0.0:
            return self.delta
        error = math.log(kl / self.target_kl) if math.isfinite(kl) else math.inf
        factor = math.exp(-self.rate * min(1.0, max(-1.0, error)))
        self.delta = min(self.delta_max, max(self.delta_min, self.delta * factor))
        return self.delta

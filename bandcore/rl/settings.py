r"""The Band's settings, one class for every trainer plug-in: fields, validation, the on-policy rule.

:class:`BandSettings` is a frozen dataclass holding everything a plug-in configures about the Band: the
divergence and its radii (one :math:`\delta` or :math:`\delta_{low}` / :math:`\delta_{high}`), the loss form
(``"clip"`` or ``"dppo"``), a radius schedule or the adaptive KL controller, the anchor (old or rollout policy),
the method (``band``, or a fixed clip for baselines), the dual clip, the cap ``max_ratio`` and the on-policy rule.
It is validated once, here, when it is built; every error names the host's key (``band_delta`` in TRL and verl,
``delta`` in :func:`bandcore.rl.band_policy_loss`) and says what is allowed.  A plug-in is a thin adapter: it maps
its configuration onto :meth:`BandSettings.from_host` and asks :meth:`BandSettings.bounds_provider` for the
per-step bounds (:class:`bandcore.rl.provider.BandBounds`).

This module imports neither torch nor any trainer (the divergence is checked with :mod:`bandcore.divergences`),
so an adapter for any stack (NumPy, JAX) can build on it.

**Radii.**  ``delta`` sets both sides; ``delta_low`` / ``delta_high`` set one side each (the lower bound
:math:`r_{lo}` from :math:`\delta_{low}`, the upper :math:`r_{up}` from :math:`\delta_{high}`); a side not given
takes ``delta``, and ``delta`` not given is :data:`DEFAULT_DELTA`.  Giving ``delta`` and a side with a different
value is refused (inconsistent).

**On-policy rule.**  The Band acts only where the ratio :math:`r = \pi/\pi_{anchor}` can move.  An adapter that
can tell from the host's configuration that the ratio is always exactly 1 (anchor ``"old"``, every pass over a
batch inside the optimizer step that generated it) calls :meth:`BandSettings.check_on_policy`, which refuses the
configuration with a :class:`ValueError` naming the host keys unless ``allow_on_policy`` is set.  Where the host
does not expose what decides it, the adapter's documentation names the host settings that make training on-policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["ANCHORS", "DEFAULT_CLIP_RATIO_C", "DEFAULT_DELTA", "DEFAULT_DELTA_RANGE", "DEFAULT_KL_RATE",
           "LOSS_FORMS", "METHODS", "SCHEDULES", "BandSettings", "check_divergence", "check_real", "resolve_radii"]

METHODS = ("band", "clip", "clip-higher")
LOSS_FORMS = ("clip", "dppo")
SCHEDULES = ("constant", "linear", "cosine", "exponential")
ANCHORS = ("old", "rollout")
#: δ when no radius is given (BandPO's).
DEFAULT_DELTA = 0.05
#: The truncation C of the dppo form, min(r, C) (DPPO's default).
DEFAULT_CLIP_RATIO_C = 20.0
#: The controller's default [δ_min, δ_max]: the range of the shipped 2-D tables.
DEFAULT_DELTA_RANGE = (0.01, 0.2)
#: The controller's default rate η (at most a factor e^η per optimizer step).
DEFAULT_KL_RATE = 0.1


def check_real(name: str, value: Any, *, above: float = 0.0, below: float | None = None) -> float:
    """``value`` as a float with ``above < value`` (and ``value < below``); TypeError / ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {value!r}")
    value = float(value)
    if not (math.isfinite(value) and value > above):
        raise ValueError(f"{name} must be a finite number > {above:g}, got {value!r}")
    if below is not None and value >= below:
        raise ValueError(f"{name} must be in ({above:g}, {below:g}), got {value!r}")
    return value


def _check_radius(name: str, value: Any) -> float:
    from bandcore._contract import check_delta

    return check_delta(check_real(name, value), name)


def check_divergence(divergence: Any, delta: float = DEFAULT_DELTA, name: str = "divergence") -> Any:
    """The :class:`bandcore.Divergence` of ``divergence`` by :func:`bandcore.divergences.resolve_region`: a
    transform (``renyi(2)``) gives its f-divergence, and its radius ``delta`` is checked after the map.

    Its error is re-raised with ``name`` and the spelling in front when the message does not already name it.
    """
    from bandcore.divergences import resolve_region

    try:
        return resolve_region(divergence, delta)[0]
    except ValueError as err:
        if name not in str(err):
            raise ValueError(f"{name} {divergence!r}: {err}") from None
        raise


def resolve_radii(delta: float | None, delta_low: float | None, delta_high: float | None, *,
                  names: tuple[str, str, str] = ("delta", "delta_low", "delta_high")) -> tuple[float, float]:
    r"""``(δ_low, δ_high)`` from ``delta`` and the one-sided radii (see the module docstring); each checked
    (a finite number, :math:`0 < \delta \le 1000`), errors naming ``names``."""
    if delta is not None:
        delta = _check_radius(names[0], delta)
    sides = []
    for name, side in zip(names[1:], (delta_low, delta_high), strict=True):
        if side is None:
            sides.append(DEFAULT_DELTA if delta is None else delta)
            continue
        side = _check_radius(name, side)
        if delta is not None and side != delta:
            raise ValueError(f"{names[0]}={delta!r} sets both radii but {name}={side!r} differs: give either "
                             f"{names[0]} or {names[1]} / {names[2]}")
        sides.append(side)
    return sides[0], sides[1]


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def _flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _count(name: str, value: Any, minimum: int) -> None:
    from bandcore._contract import check_positive_int

    check_positive_int(value, name, minimum=minimum)


@dataclass(frozen=True)
class BandSettings:
    r"""Every setting of the Band in a trainer, validated when built (see the module docstring).

    Parameters
    ----------
    divergence
        f-divergence of the trust region: a spelling of :func:`bandcore.divergences.resolve_region` (catalogue
        name, alias, ``alpha(a)``, a formula in ``u``, a transform such as ``renyi(2)``) or a
        :class:`bandcore.Divergence`; ``"kl"`` is :math:`KL(\pi_{old}\|\pi)`.
    delta, delta_low, delta_high
        Radii (module docstring); ``delta`` is also the start of a schedule or of the controller.
    max_ratio
        Optional cap :math:`u \le` ``max_ratio`` (> 1) on the upper bound.
    method
        ``"band"``, or ``"clip"`` / ``"clip-higher"``: the fixed clip :math:`[1-\varepsilon,
        1+\varepsilon_{high}]` (``clip_eps``, ``clip_eps_high``; clip-higher's default :math:`\varepsilon_{high}`
        is 0.28) through the same code, for baselines.
    dual_clip
        :math:`c > 1`: with the clip form, the loss of a token with :math:`A < 0` is capped at :math:`-A c`.
    loss_form
        ``"clip"``: PPO's clipped surrogate at the bounds; ``"dppo"``: DPPO's masked, truncated-IS objective
        :math:`-A\,\min(r, C)\,\log\pi` over the tokens inside the trust region or moving back toward it
        (:mod:`bandcore.rl.loss`), with :math:`C` = ``clip_ratio_c`` (default :data:`DEFAULT_CLIP_RATIO_C`).
    delta_schedule, delta_end, delta_steps, delta_hold_steps
        A radius that moves with the optimizer step :math:`t` (:mod:`bandcore.rl.schedule`): ``"constant"``,
        or ``"linear"`` / ``"cosine"`` / ``"exponential"`` from ``delta`` to ``delta_end`` over ``delta_steps``
        steps after ``delta_hold_steps`` steps at ``delta``.
    target_kl, kl_rate, delta_min, delta_max
        The adaptive controller (:class:`bandcore.rl.schedule.KLController`): after each optimizer step δ moves
        toward the measured :math:`KL(\pi_{old}\|\pi)` = ``target_kl`` at rate ``kl_rate``, within
        ``[delta_min, delta_max]``.
    anchor
        ``"old"``: the Band of the old policy's probability; ``"rollout"``: of the rollout engine's.
    allow_on_policy
        Accept a host configuration whose ratio is always 1 (module docstring).
    check
        Check the loss inputs' values on every call (one host synchronisation).
    key_prefix, key_names
        How the host spells the keys in error messages: ``key_prefix + field`` (``band_delta``), or
        ``key_names[field]`` for a field the host stores under its own key (verl's ``clip_ratio_c``).
    """

    divergence: Any = "kl"
    delta: float | None = None
    delta_low: float | None = None
    delta_high: float | None = None
    max_ratio: float | None = None
    method: str = "band"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    dual_clip: float | None = None
    loss_form: str = "clip"
    clip_ratio_c: float | None = None
    delta_schedule: str = "constant"
    delta_end: float | None = None
    delta_steps: int | None = None
    delta_hold_steps: int = 0
    target_kl: float | None = None
    kl_rate: float = DEFAULT_KL_RATE
    delta_min: float = DEFAULT_DELTA_RANGE[0]
    delta_max: float = DEFAULT_DELTA_RANGE[1]
    anchor: str = "old"
    allow_on_policy: bool = False
    check: bool = True
    key_prefix: str = field(default="", repr=False, compare=False)
    key_names: tuple[tuple[str, str], ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_host(cls, source: Any, *, prefix: str = "band_", names: Mapping[str, str] | None = None,
                  **fixed: Any) -> BandSettings:
        """Settings read from a host's configuration ``source`` (an object with attributes, or a mapping with
        ``get``, such as an OmegaConf ``DictConfig``): the field ``f`` from the key ``names.get(f, prefix + f)``
        when present, else its default; ``fixed`` gives fields the adapter sets itself."""
        names = dict(names or {})
        values: dict[str, Any] = {}
        missing = object()
        for item in fields(cls):
            if item.name in ("key_prefix", "key_names") or item.name in fixed:
                continue
            key = names.get(item.name, prefix + item.name)
            value = source.get(key, missing) if isinstance(source, Mapping) or hasattr(source, "keys") else \
                getattr(source, key, missing)
            if value is not missing:
                values[item.name] = value
        return cls(**values, **fixed, key_prefix=prefix, key_names=tuple(sorted(names.items())))

    def key(self, name: str) -> str:
        """The host's key of the field ``name`` (for error messages)."""
        return dict(self.key_names).get(name, self.key_prefix + name)

    def __post_init__(self) -> None:
        key = self.key
        if not isinstance(self.divergence, str) and type(self.divergence).__name__ != "Divergence":
            raise TypeError(f"{key('divergence')} must be a divergence name or alias (str) or a "
                            f"bandcore.Divergence, got {self.divergence!r}")
        _choice(key("method"), self.method, METHODS)
        _choice(key("loss_form"), self.loss_form, LOSS_FORMS)
        _choice(key("delta_schedule"), self.delta_schedule, SCHEDULES)
        _choice(key("anchor"), self.anchor, ANCHORS)
        _flag(key("allow_on_policy"), self.allow_on_policy)
        _flag(key("check"), self.check)
        low, high = resolve_radii(self.delta, self.delta_low, self.delta_high,
                                  names=(key("delta"), key("delta_low"), key("delta_high")))
        if self.max_ratio is not None:
            check_real(key("max_ratio"), self.max_ratio, above=1.0)
        check_real(key("clip_eps"), self.clip_eps, below=1.0)
        if self.clip_eps_high is not None:
            check_real(key("clip_eps_high"), self.clip_eps_high)
        self._check_loss_form()
        self._check_moving_radius(low, high)
        check_divergence(self.divergence, low, key("divergence"))  # raises, naming the spelling
        if high != low:
            check_divergence(self.divergence, high, key("divergence"))

    def _check_loss_form(self) -> None:
        key = self.key
        if self.dual_clip is not None:
            check_real(key("dual_clip"), self.dual_clip, above=1.0)
            if self.loss_form == "dppo":
                raise ValueError(f"{key('dual_clip')}={self.dual_clip!r} applies to {key('loss_form')}='clip'; "
                                 f"the dppo form truncates the ratio at {key('clip_ratio_c')} instead")
        if self.clip_ratio_c is not None:
            check_real(key("clip_ratio_c"), self.clip_ratio_c, above=1.0)
            if self.loss_form != "dppo":
                raise ValueError(f"{key('clip_ratio_c')}={self.clip_ratio_c!r} is the truncation of "
                                 f"{key('loss_form')}='dppo', got {key('loss_form')}={self.loss_form!r}")

    def _check_moving_radius(self, low: float, high: float) -> None:
        key = self.key
        scheduled = self.delta_schedule != "constant"
        if scheduled:
            if self.delta_end is None or self.delta_steps is None:
                raise ValueError(f"{key('delta_schedule')}={self.delta_schedule!r} needs {key('delta_end')} "
                                 f"and {key('delta_steps')}, got {key('delta_end')}={self.delta_end!r}, "
                                 f"{key('delta_steps')}={self.delta_steps!r}")
            _check_radius(key("delta_end"), self.delta_end)
            _count(key("delta_steps"), self.delta_steps, 1)
        else:
            for name in ("delta_end", "delta_steps"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{key(name)}={getattr(self, name)!r} is unused with {key('delta_schedule')}="
                                     f"'constant'; choose one of {SCHEDULES[1:]} or leave it unset")
        _count(key("delta_hold_steps"), self.delta_hold_steps, 0)
        controlled = self.target_kl is not None
        if controlled:
            check_real(key("target_kl"), self.target_kl)
            if scheduled:
                raise ValueError(f"{key('target_kl')} (the adaptive controller) and {key('delta_schedule')}="
                                 f"{self.delta_schedule!r} both move the radius: use one of them")
        check_real(key("kl_rate"), self.kl_rate, below=1.0 + 1e-12)
        lo, hi = _check_radius(key("delta_min"), self.delta_min), _check_radius(key("delta_max"), self.delta_max)
        if controlled and not lo <= low <= hi:
            raise ValueError(f"{key('delta_min')} <= {key('delta')} <= {key('delta_max')} is needed by the "
                             f"controller, got {lo!r}, {low!r}, {hi!r}")
        if lo >= hi:
            raise ValueError(f"{key('delta_min')} must be < {key('delta_max')}, got {lo!r} and {hi!r}")
        if (scheduled or controlled) and (low != high or self.method != "band"):
            what = f"{key('delta_schedule')}={self.delta_schedule!r}" if scheduled else key("target_kl")
            raise ValueError(f"{what} moves one radius of the Band: it needs {key('method')}='band' and "
                             f"{key('delta_low')} == {key('delta_high')}, got {key('method')}={self.method!r}, "
                             f"radii ({low!r}, {high!r})")

    @property
    def radii(self) -> tuple[float, float]:
        """``(δ_low, δ_high)`` at the start (the radii when nothing moves them)."""
        return resolve_radii(self.delta, self.delta_low, self.delta_high)

    @property
    def moving(self) -> bool:
        """True when a schedule or the controller moves δ."""
        return self.delta_schedule != "constant" or self.target_kl is not None

    @property
    def truncation(self) -> float:
        """:math:`C` of the dppo form."""
        return DEFAULT_CLIP_RATIO_C if self.clip_ratio_c is None else float(self.clip_ratio_c)

    def check_on_policy(self, ratio_always_one: bool, host_settings: str) -> None:
        """The on-policy rule: raise ``ValueError`` naming ``host_settings`` when the host's configuration keeps
        the ratio at exactly 1 (and the anchor is the old policy), unless ``allow_on_policy``."""
        if ratio_always_one and self.anchor == "old" and not self.allow_on_policy:
            raise ValueError(
                f"the ratio is always 1 with {host_settings}, so the Band never acts; change these settings so "
                f"that a batch is optimised after an optimizer step, or set {self.key('allow_on_policy')}=True "
                "if on-policy training is intended"
            )

    def bounds_provider(self):
        """The per-step bounds (:class:`bandcore.rl.provider.BandBounds`): the divergence resolved, the 2-D
        table loaded when δ moves, the schedule or controller at step 0."""
        from .provider import BandBounds

        return BandBounds(self)

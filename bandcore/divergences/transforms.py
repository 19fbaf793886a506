r"""Trust regions that are exact monotone transforms of an f-divergence: Rényi, Chernoff, Bhattacharyya.

For the catalogue's α-family generator :math:`f_\alpha(u) = (u^\alpha - 1 - \alpha(u - 1))/(\alpha(\alpha - 1))`
(:math:`\alpha > 0`, :math:`\alpha \ne 1`), :math:`\sum_j \pi_{old}\,u^\alpha = 1 + \alpha(\alpha-1) D_{f_\alpha}`
(the linear term sums to 0), so the Rényi divergence of order α

.. math::  D_\alpha(\pi\|\pi_{old}) = \frac{1}{\alpha - 1}\log \sum_j \pi^\alpha \pi_{old}^{1-\alpha}
           = \frac{\log\bigl(1 + \alpha(\alpha-1) D_{f_\alpha}\bigr)}{\alpha - 1}

is an increasing function of :math:`D_{f_\alpha}`, and for α > 1 and 0 < α < 1 alike (for α < 1 both the
division by α − 1 and the one by α(α − 1) flip the inequality)

.. math::  D_\alpha \le \delta \iff D_{f_\alpha} \le \frac{e^{(\alpha-1)\delta} - 1}{\alpha(\alpha - 1)}
           = \frac{\operatorname{expm1}((\alpha-1)\delta)}{\alpha(\alpha-1)}.

* ``renyi(a)``: the above.  Where the catalogue holds the same generator up to a factor, the region is stated
  for that entry (its closed-form solver and shipped tables apply): :math:`f_2 = \tfrac12 (u-1)^2`, so
  ``renyi(2)`` is :math:`\chi^2 \le e^\delta - 1` (``pearson``; Rényi-2 is :math:`\log(1 + \chi^2)`), and
  :math:`f_{1/2} = 2(\sqrt u - 1)^2`, so ``renyi(0.5)`` is ``hellinger`` :math:`\le -2\operatorname{expm1}(-\delta/2)`.
* ``chernoff(a)``, 0 < α < 1: the Chernoff α-divergence :math:`-\log \sum_j \pi^\alpha \pi_{old}^{1-\alpha}
  = (1-\alpha) D_\alpha`, i.e. ``renyi(a)`` at :math:`\delta/(1-\alpha)`.
* ``bhattacharyya``: :math:`-\log \sum_j \sqrt{\pi\,\pi_{old}} = D_{1/2}/2` = ``chernoff(0.5)``.  With the
  catalogue's (not halved) squared Hellinger :math:`H = \sum(\sqrt\pi - \sqrt{\pi_{old}})^2 = 2 - 2\sum\sqrt{\pi
  \pi_{old}}`, it is :math:`H \le -2\operatorname{expm1}(-\delta) = 2(1 - e^{-\delta})`.

Range.  The map is increasing and exact in floating point to a few ulps (one ``expm1``).  For α > 1 it grows
without bound; a user δ whose mapped radius exceeds the kernel's largest radius (``DELTA_MAX``) is refused,
naming the largest accepted δ.  For 0 < α < 1 the map tends, as δ → ∞, to the f-divergence's supremum
:math:`\sup D_{f_\alpha} = 1/(\alpha(1-\alpha))` (disjoint supports), which no finite δ reaches: the Rényi ball
is never the whole simplex, but its Band is: once :math:`g_f(p, 1/p)` and :math:`g_f(p, 0)` are both below the
mapped radius the kernel returns :math:`[0, 1/p]`, exactly as for the f-divergence itself.  Once
:math:`e^{(\alpha-1)\delta}` is below the float64 resolution the mapped radius rounds to the supremum itself,
and every bound is then saturated: the whole simplex.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .._contract import DELTA_MAX, check_delta

__all__ = ["TRANSFORMS", "Transform", "is_transform", "parse_transform"]

#: family name -> (what it is, reference); the spelling takes an order ``a`` unless noted.
TRANSFORMS: dict[str, dict[str, str]] = {
    "renyi": dict(
        convention="Rényi divergence of order a > 0, a ≠ 1: log(Σ π^a π_old^(1−a))/(a − 1) (nats)",
        reference="Rényi (1961), On measures of entropy and information",
    ),
    "chernoff": dict(
        convention="Chernoff a-divergence, 0 < a < 1: −log Σ π^a π_old^(1−a) = (1 − a)·renyi(a)",
        reference="Chernoff (1952), A measure of asymptotic efficiency for tests of a hypothesis",
    ),
    "bhattacharyya": dict(
        convention="Bhattacharyya distance −log Σ √(π π_old) = renyi(0.5)/2 (no order)",
        reference="Bhattacharyya (1943), On a measure of divergence between two statistical populations",
    ),
}

_NUMBER = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
_SPELLING = re.compile(r"^(renyi|rényi|chernoff)\s*\(\s*(?:(?:alpha|a)\s*=\s*)?(.*?)\s*\)$")
_BARE = {"renyi": "renyi", "rényi": "renyi", "chernoff": "chernoff", "bhattacharyya": "bhattacharyya"}
#: renyi orders whose f_a is a catalogue generator times a factor: a -> (catalogue name, factor c, f_a = f/c)
_CATALOGUE_EQUAL = {2.0: ("pearson", 2.0), 0.5: ("hellinger", 0.5)}


@dataclass(frozen=True)
class Transform:
    r"""A trust region :math:`T(D_f) \le \delta` with :math:`T` increasing: held as ``D_f <= to_f(delta)``.

    Parameters
    ----------
    name : str
        Canonical spelling (``"renyi(2)"``, ``"chernoff(0.3)"``, ``"bhattacharyya"``).
    base : str
        Spelling of the f-divergence the region is stated in (``"pearson"``, ``"alpha(3)"``).
    alpha : float
        The Rényi order the region reduces to.
    delta_scale : float
        The user's δ is a Rényi radius times this (1 for Rényi, 1/(1 − α) for Chernoff).
    factor : float
        :math:`D_{base} = \text{factor}\cdot D_{f_\alpha}`.
    convention, reference : documentation.
    """

    name: str
    base: str
    alpha: float
    delta_scale: float
    factor: float
    convention: str
    reference: str

    @property
    def f_supremum(self) -> float:
        r""":math:`\sup D_{base}`: ``factor/(α(1−α))`` for α < 1 (disjoint supports), ``inf`` for α > 1."""
        a = self.alpha
        return self.factor / (a * (1 - a)) if a < 1 else math.inf

    @property
    def delta_max(self) -> float:
        """The largest δ whose mapped radius the kernels accept (``DELTA_MAX``), ``inf`` when every δ maps below."""
        a = self.alpha
        if a < 1 and self.f_supremum <= DELTA_MAX:
            return math.inf
        return math.log1p(a * (a - 1) * DELTA_MAX / self.factor) / (a - 1) / self.delta_scale

    def to_f(self, delta: Any, name: str = "delta") -> float:
        r"""The radius of the base f-divergence: ``factor · expm1((α−1)·s·δ)/(α(α−1))``, checked."""
        value = check_delta(delta, name)
        a = self.alpha
        mapped = self.factor * math.expm1((a - 1) * self.delta_scale * value) / (a * (a - 1))
        if not mapped <= DELTA_MAX:
            raise ValueError(
                f"{name}={value!r} for {self.name} is a {self.base} radius of {mapped:.6g}, above the largest "
                f"accepted ({DELTA_MAX:g}); {self.name} accepts 0 < {name} <= {self.delta_max:.6g}"
            )
        if not mapped > 0:
            raise ValueError(f"{name}={value!r} for {self.name} maps to a {self.base} radius of 0 (underflow)")
        return mapped

    def from_f(self, delta_f: float) -> float:
        r"""The inverse map: :math:`\log(1 + \alpha(\alpha-1) D_f/\text{factor})/((\alpha - 1) s)`."""
        a = self.alpha
        return math.log1p(a * (a - 1) * float(delta_f) / self.factor) / (a - 1) / self.delta_scale


def is_transform(spelling: Any) -> bool:
    """True if ``spelling`` is a string naming a transform family (``renyi(...)``, ``chernoff(...)``,
    ``bhattacharyya``), valid or not; such a spelling is never read as a formula."""
    if not isinstance(spelling, str):
        return False
    key = spelling.strip().lower()
    return key in _BARE or _SPELLING.match(key) is not None


def parse_transform(spelling: str) -> Transform:
    """The :class:`Transform` of a spelling for which :func:`is_transform` holds; :class:`ValueError` naming
    the order ``a`` (its value and the allowed range) for a bad or missing order."""
    key = spelling.strip().lower()
    if key == "bhattacharyya":
        return _build("bhattacharyya", 0.5, chernoff=True)
    if key in _BARE:
        family = _BARE[key]
        raise ValueError(f"divergence {spelling!r}: {family} needs an order a, spelled {family}(a), e.g. {family}(2)")
    match = _SPELLING.match(key)
    family = _BARE[match.group(1)]
    text = match.group(2)
    if not re.fullmatch(_NUMBER, text):
        raise ValueError(f"divergence {spelling!r}: the order a of {family}(a) must be a number, got a={text!r}")
    alpha = float(text)
    if family == "renyi":
        if not (math.isfinite(alpha) and 0 < alpha <= 64) or alpha == 1:
            raise ValueError(
                f"divergence {spelling!r}: the order a of renyi(a) must satisfy 0 < a <= 64 and a != 1 "
                f"(a = 1 is KL: spell it reverse_kl), got a={alpha!r}"
            )
        return _build(f"renyi({_shortest(alpha)})", alpha, chernoff=False)
    if not (math.isfinite(alpha) and 0 < alpha < 1):
        raise ValueError(f"divergence {spelling!r}: the order a of chernoff(a) must satisfy 0 < a < 1, got a={alpha!r}")
    return _build(f"chernoff({_shortest(alpha)})", alpha, chernoff=True)


def _build(name: str, alpha: float, *, chernoff: bool) -> Transform:
    base, factor = _CATALOGUE_EQUAL.get(alpha, (f"alpha({_shortest(alpha)})", 1.0))
    family = name.split("(")[0]
    a = Fraction(repr(alpha))
    rate = a - 1 if family == "renyi" else Fraction(-1)  # (α − 1)·s: the user's δ in the exponent
    shown = f"{name} <= delta  <=>  {base} <= {factor:g}*expm1(({rate})*delta)/({a * (a - 1)})"
    doc = TRANSFORMS[family]
    return Transform(
        name=name, base=base, alpha=alpha, delta_scale=1 / (1 - alpha) if chernoff else 1.0, factor=factor,
        convention=f"{doc['convention']}; {shown}", reference=doc["reference"],
    )


def _shortest(value: float) -> str:
    short = f"{value:g}"
    return short if float(short) == value else repr(value)

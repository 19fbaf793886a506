"""The catalogue: one declarative entry per divergence (its generator as a formula, and its documentation).

Everything else about a divergence (f'(1), f''(1), f(0), saturation, closed forms) is derived from the formula
by :mod:`bandcore.derive`, never typed here.
"""

from __future__ import annotations

from fractions import Fraction

__all__ = ["ALPHA_DEFAULT", "ALPHA_DOC", "CATALOGUE", "alpha_formula"]

CATALOGUE: dict[str, dict] = {
    "kl": dict(
        formula="-log(u)",
        aliases=("bandkl",),
        convention="KL(π_old‖π) = Σ π_old log(π_old/π); the direction BandPO trains with",
        reference="Kullback & Leibler (1951); BandPO (2025)",
    ),
    "reverse_kl": dict(
        formula="u*log(u)",
        convention="KL(π‖π_old) = Σ π log(π/π_old)",
        reference="Kullback & Leibler (1951)",
    ),
    "tv": dict(
        formula="abs(u - 1)/2",
        aliases=("bandtv",),
        convention="total variation ½ Σ |π − π_old|, in [0, 1]",
        reference="Csiszár (1967)",
    ),
    "pearson": dict(
        formula="(u - 1)**2",
        aliases=("bandchi2",),
        convention="Pearson χ² = Σ (π − π_old)²/π_old",
        reference="Pearson (1900)",
    ),
    "neyman": dict(
        formula="(u - 1)**2/u",
        convention="Neyman χ² = Σ (π − π_old)²/π",
        reference="Neyman (1949)",
    ),
    "hellinger": dict(
        formula="(sqrt(u) - 1)**2",
        convention="squared Hellinger Σ (√π − √π_old)², in [0, 2] (not halved)",
        reference="Hellinger (1909)",
    ),
    "lecam": dict(
        formula="(u - 1)**2/(u + 1)",
        convention="Le Cam / triangular discrimination Σ (π − π_old)²/(π + π_old), in [0, 2]",
        reference="Le Cam (1986)",
    ),
    "js": dict(
        formula="(u*log(u) - (1 + u)*log((1 + u)/2))/2",
        convention="Jensen–Shannon ½KL(π‖m) + ½KL(π_old‖m), m = (π + π_old)/2, in [0, log 2] (nats)",
        reference="Lin (1991)",
    ),
}

ALPHA_DEFAULT = 3.0
ALPHA_DOC = dict(
    convention="α-divergence (u^α − 1 − α(u − 1))/(α(α − 1)); α→1 reverse KL, α→0 KL, α=2 Pearson/2",
    reference="Amari (1985); Cichocki & Amari (2010)",
)


def alpha_formula(alpha: Fraction) -> str:
    """The α-family generator as a formula (its limits at α = 0 and 1 are KL and reverse KL, normalised)."""
    if alpha == 0:
        return "-log(u) + u - 1"
    if alpha == 1:
        return "u*log(u) - u + 1"
    a = f"({alpha.numerator}/{alpha.denominator})"  # exact: the grammar checks the folded value, not digits
    return f"(u**{a} - 1 - {a}*(u - 1))/({a}*({a} - 1))"

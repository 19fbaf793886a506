"""The shared oracle suite: 50-digit mpmath reference cases for the Band, loaded from ``data/oracle_cases.csv``.

>>> from oracle_cases import load_oracle_cases           # tests/ is on sys.path under pytest
>>> cases = load_oracle_cases("kl")                       # or None for all, or a Divergence / "alpha(0.5)"
>>> case = cases[0]; case.log_p, case.delta, case.log_upper   # floats (rounded once from the 30-digit refs)

Every row was computed by ``bandcore.oracle.band_log_mp`` at 50 digits and stored to 30 significant digits
(``tests/data/make_oracle_cases.py`` regenerates the file; ``tests/band/test_oracle_suite.py`` checks it is fresh).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import mpmath as mp
import numpy as np

from bandcore.divergences import Divergence, get_divergence

__all__ = ["ORACLE_CASES_PATH", "OracleCase", "load_oracle_arrays", "load_oracle_cases"]

ORACLE_CASES_PATH = Path(__file__).parent / "data" / "oracle_cases.csv"


@dataclass(frozen=True)
class OracleCase:
    """One reference: the Band of ``divergence`` at (``log_p``, ``delta``) to 30 digits."""

    divergence: Divergence
    log_p: float
    delta: float
    log_lower_text: str
    log_upper_text: str
    lower_saturated: bool
    upper_saturated: bool

    @property
    def name(self) -> str:
        """The divergence's canonical name, e.g. ``"kl"`` or ``"alpha(0.5)"``."""
        return self.divergence.name

    @property
    def log_lower(self) -> float:
        """log r_lo rounded once to float64 (``-inf`` when saturated)."""
        return float(self.log_lower_text)

    @property
    def log_upper(self) -> float:
        """log r_up rounded once to float64 (exactly ``-log_p`` when saturated)."""
        return -self.log_p if self.upper_saturated else float(self.log_upper_text)

    def log_bounds_mp(self) -> tuple[mp.mpf, mp.mpf]:
        """(log r_lo, log r_up) as 30-digit mpf values."""
        with mp.workdps(40):
            return mp.mpf(self.log_lower_text), mp.mpf(self.log_upper_text)


def _divergence(name: str, alpha: str) -> Divergence:
    return get_divergence(name, alpha=float(alpha)) if alpha else get_divergence(name)


@lru_cache(maxsize=1)
def _all_cases() -> tuple[OracleCase, ...]:
    with ORACLE_CASES_PATH.open(newline="") as handle:
        return tuple(
            OracleCase(
                divergence=_divergence(row["divergence"], row["alpha"]),
                log_p=float(row["log_p"]),
                delta=float(row["delta"]),
                log_lower_text=row["log_lower"],
                log_upper_text=row["log_upper"],
                lower_saturated=row["lower_saturated"] == "1",
                upper_saturated=row["upper_saturated"] == "1",
            )
            for row in csv.DictReader(handle)
        )


def load_oracle_cases(divergence: str | Divergence | None = None) -> list[OracleCase]:
    """All reference cases, or those of one divergence (name, alias, ``"alpha(0.5)"`` or a Divergence)."""
    cases = _all_cases()
    if divergence is None:
        return list(cases)
    if isinstance(divergence, str) and divergence.startswith("alpha("):
        wanted = get_divergence("alpha", alpha=float(divergence[len("alpha(") : -1]))
    else:
        wanted = get_divergence(divergence)
    selected = [case for case in cases if case.divergence == wanted]
    if not selected:
        names = sorted({case.name for case in cases})
        raise ValueError(f"no oracle cases for divergence {wanted.name!r}; available: {names}")
    return selected


def load_oracle_arrays(divergence: str | Divergence, delta: float | None = None) -> dict[str, np.ndarray]:
    """One divergence's cases as float64 arrays ``log_p, delta, log_lower, log_upper`` (+ saturation flags)."""
    cases = [c for c in load_oracle_cases(divergence) if delta is None or c.delta == delta]
    return {
        "log_p": np.array([c.log_p for c in cases]),
        "delta": np.array([c.delta for c in cases]),
        "log_lower": np.array([c.log_lower for c in cases]),
        "log_upper": np.array([c.log_upper for c in cases]),
        "lower_saturated": np.array([c.lower_saturated for c in cases]),
        "upper_saturated": np.array([c.upper_saturated for c in cases]),
    }

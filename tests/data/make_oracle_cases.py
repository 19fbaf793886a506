"""Regenerate ``oracle_cases.csv``: 50-digit mpmath references for the Band (``bandcore.oracle.band_log_mp``).

Run ``python tests/data/make_oracle_cases.py`` (a few minutes).  Each row: divergence name, α (for the α-family,
else empty), ``log_p`` and ``delta`` as exact ``repr`` of float64, ``log_lower``/``log_upper`` to 30 significant
digits (``-inf`` for a saturated lower bound; a saturated upper bound is exactly ``-log_p``), and the two
saturation flags.  ``tests/band/test_oracle_suite.py`` re-computes a few rows to check the file is fresh.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

import mpmath as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bandcore.divergences import get_divergence
from bandcore.divergences.catalogue import CATALOGUE
from bandcore.oracle import band_log_mp

PATH = Path(__file__).with_name("oracle_cases.csv")
COLUMNS = ("divergence", "alpha", "log_p", "delta", "log_lower", "log_upper", "lower_saturated", "upper_saturated")
DIVERGENCES = (
    *((name, None) for name in CATALOGUE),
    ("alpha", 3.0),
    ("alpha", 2.0),
    ("alpha", 0.5),
    ("alpha", -1.0),
)
# dense near log p = -inf (p -> 0) and near log p = 0 (p -> 1)
LOG_P = (
    -700.0, -300.0, -50.0, -10.0, -3.0, math.log(0.08), -1.0, math.log(0.5),
    -0.1, -1e-3, -1e-8, -1e-16, -1e-300,
)  # fmt: skip
DELTA = (1e-8, 1e-3, 0.05, 0.5, 10.0)
DIGITS = 30


def row(name: str, alpha: float | None, log_p: float, delta: float) -> dict[str, str]:
    """One reference case."""
    div = get_divergence(name, **({} if alpha is None else {"alpha": alpha}))
    lower, upper = band_log_mp(div, log_p, delta, dps=50)
    return {
        "divergence": name,
        "alpha": "" if alpha is None else repr(alpha),
        "log_p": repr(log_p),
        "delta": repr(delta),
        "log_lower": "-inf" if lower == mp.ninf else mp.nstr(lower, DIGITS, min_fixed=1, max_fixed=0),
        "log_upper": mp.nstr(upper, DIGITS, min_fixed=1, max_fixed=0),
        "lower_saturated": str(int(lower == mp.ninf)),
        "upper_saturated": str(int(upper == -mp.mpf(log_p))),
    }


def main() -> None:
    with PATH.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for name, alpha in DIVERGENCES:
            for log_p in LOG_P:
                for delta in DELTA:
                    writer.writerow(row(name, alpha, log_p, delta))
            print(f"{name}{'' if alpha is None else f'({alpha:g})'} done", flush=True)


if __name__ == "__main__":
    main()

"""examples/load_table.py: a ≤ 50-line NumPy-only loader that agrees with bandcore."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bandcore import BandTable
from bandcore.tables import SHIPPED_DIR, shipped_name
from bandcore.tables.shipped import SHIPPED
from bandcore.tables.threshold import SplitBound

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "load_table.py"


def test_example_is_short_and_standalone():
    text = EXAMPLE.read_text()
    assert len(text.splitlines()) <= 50
    assert "import bandcore" not in text and "from bandcore" not in text


#: shipped 1-D tables with logarithmic tails, which the example leaves to bandcore (it reads every kind, split
#: bounds included)
TAILS = ("reverse_kl",)
READABLE = [(n, d) for n, d, _ in SHIPPED if not isinstance(d, tuple) and n not in TAILS]


@pytest.mark.parametrize(("name", "delta"), READABLE)
def test_example_agrees_with_bandcore(name, delta):
    band_log = runpy.run_path(str(EXAMPLE))["band_log"]
    rng = np.random.default_rng(7)
    path = SHIPPED_DIR / shipped_name(name, delta)
    table = BandTable.load(path)
    stars = [b.threshold for b in (table.lower, table.upper) if isinstance(b, SplitBound)]
    near = np.concatenate([s * (1 + np.array([-1e-15, -1e-9, -1e-4, 1e-4, 1e-9, 1e-15])) for s in stars] + [[]])
    log_p = np.concatenate([-np.exp(rng.uniform(-40, 6.5, 3000)), [0.0, -1e-300, -700.0, -1e4], -near])
    mine = band_log(path, log_p)
    ours = table.log(log_p)
    for a, b in zip(mine, ours, strict=True):
        assert np.array_equal(np.isneginf(a), np.isneginf(b))
        finite = np.isfinite(b)
        assert np.all(np.abs(a[finite] - b[finite]) <= 1e-12 * np.maximum(1, np.abs(b[finite])))  # exp of F ~ 700


def test_example_refuses_a_table_with_logarithmic_tails():
    band_log = runpy.run_path(str(EXAMPLE))["band_log"]
    with pytest.raises(ValueError, match="read it with bandcore"):
        band_log(SHIPPED_DIR / shipped_name("reverse_kl", 0.05), np.array([-1.0]))


def test_example_runs_as_a_script():
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), str(SHIPPED_DIR / "kl_delta0.05.npz"), "-3.0"],
        capture_output=True, text=True, check=True, cwd="/",
    ).stdout  # fmt: skip
    assert "log p = -3.0: log r in [-1.825177" in out

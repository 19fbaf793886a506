"""examples/load_table.py: a ≤ 40-line NumPy-only loader that agrees with bandcore."""

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

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "load_table.py"


def test_example_is_short_and_standalone():
    text = EXAMPLE.read_text()
    assert len(text.splitlines()) <= 40
    assert "import bandcore" not in text and "from bandcore" not in text


@pytest.mark.parametrize(("name", "delta"), [(n, d) for n, d, _ in SHIPPED if not isinstance(d, tuple)])
def test_example_agrees_with_bandcore(name, delta):
    band_log = runpy.run_path(str(EXAMPLE))["band_log"]
    rng = np.random.default_rng(7)
    log_p = np.concatenate([-np.exp(rng.uniform(-40, 6.5, 3000)), [0.0, -1e-300, -700.0, -1e4]])
    path = SHIPPED_DIR / shipped_name(name, delta)
    mine = band_log(path, log_p)
    ours = BandTable.load(path).log(log_p)
    for a, b in zip(mine, ours, strict=True):
        assert np.array_equal(np.isneginf(a), np.isneginf(b))
        finite = np.isfinite(b)
        assert np.all(np.abs(a[finite] - b[finite]) <= 1e-12 * np.maximum(1, np.abs(b[finite])))  # exp of F ~ 700


def test_example_runs_as_a_script():
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), str(SHIPPED_DIR / "kl_delta0.05.npz"), "-3.0"],
        capture_output=True, text=True, check=True, cwd="/",
    ).stdout  # fmt: skip
    assert "log p = -3.0: log r in [-1.825177" in out

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


#: shipped tables the example reads: kinds 0-3 (a split bound, kinds 4/5, needs the near grid: bandcore)
SPLIT = ("js", "reverse_kl", "alpha(0.7)")


ORIGINAL_KINDS = [(n, d) for n, d, _ in SHIPPED if not isinstance(d, tuple) and n not in SPLIT]


@pytest.mark.parametrize(("name", "delta"), ORIGINAL_KINDS)
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


def test_example_refuses_a_split_table():
    band_log = runpy.run_path(str(EXAMPLE))["band_log"]
    with pytest.raises(ValueError, match="read it with bandcore"):
        band_log(SHIPPED_DIR / shipped_name("js", 0.05), np.array([-1.0]))


def test_example_runs_as_a_script():
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), str(SHIPPED_DIR / "kl_delta0.05.npz"), "-3.0"],
        capture_output=True, text=True, check=True, cwd="/",
    ).stdout  # fmt: skip
    assert "log p = -3.0: log r in [-1.825177" in out

"""``python -m benchmarks.ab``: two trees timed in their own worker processes, each answering the same rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.ab import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_speed_ab_of_the_torch_backend_times_both_trees(capsys):
    main(["speed", str(ROOT), str(ROOT), "--backend", "torch", "--output", "ratio", "--n", "3000", "--reps", "1",
          "--names", "kl", "--threads", "1", "--inputs", "mid", "--cpu-time"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["before", "after"]  # each worker's 'ready' line
    row = lines[-1].split()
    assert row[:3] == ["kl", "mid", "1"]
    before, after, ratio = (float(v) for v in row[3:6])
    assert all(math.isfinite(v) and v > 0 for v in (before, after))  # a tree that cannot run a row prints nan
    assert ratio == pytest.approx(before / after, rel=0.01)

"""``bandcore bounds``: its table for a name, ``alpha(a)`` and a formula; every bad value is one line, exit 2."""

from __future__ import annotations

import numpy as np
import pytest

from bandcore.band import band
from bandcore.cli import main


def _rows(out: str) -> list[list[float]]:
    lines = out.strip().splitlines()
    return [[float(v) for v in line.split()] for line in lines[2:]]


def test_default_kl_table(capsys):
    assert main(["bounds"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.strip().splitlines()
    assert lines[0] == "Band of kl at delta = 0.05   (PPO clip eps = 0.2)"
    assert lines[1].split() == [
        "p", "lower", "upper", "dpi_min", "dpi_max", "ppo_lower", "ppo_upper", "ppo_dpi_min", "ppo_dpi_max"
    ]  # fmt: skip
    rows = _rows(captured.out)
    p = np.array([row[0] for row in rows])
    np.testing.assert_array_equal(p, [0.001, 0.08, 0.5, 0.99])
    lower, upper = band(np.log(p), "kl", 0.05)
    for row, pi, lo, up in zip(rows, p, lower, upper, strict=True):
        np.testing.assert_allclose(row[1:3], [lo, up], rtol=1e-5)  # printed with 6 significant digits
        np.testing.assert_allclose(row[3:5], [pi * (lo - 1), pi * (up - 1)], rtol=1e-5, atol=1e-12)
        assert row[1] <= 1 <= row[2]
        assert row[5] == pytest.approx(0.8) and row[6] == pytest.approx(min(1.2, 1 / pi), rel=1e-3)


def test_options_are_used(capsys):
    assert main(["bounds", "--divergence", "tv", "--delta", "0.1", "--p", "0.5", "1", "--eps", "0.3"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "Band of tv at delta = 0.1   (PPO clip eps = 0.3)"
    rows = _rows(out)
    assert [row[0] for row in rows] == [0.5, 1.0]
    np.testing.assert_allclose(rows[0][1:3], [0.8, 1.2], rtol=1e-6)  # TV: 1 -/+ delta/p
    assert rows[1][2] == 1.0 and rows[1][6] == 1.0  # p = 1: nothing can rise, PPO's cap too
    assert rows[0][5] == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("spelling", "name"), [("alpha(0.5)", "alpha(0.5)"), ("(u-1)**2/2", "(u - 1)**2/2"), ("bandkl", "kl")]
)
def test_divergence_spellings(capsys, spelling, name):
    assert main(["bounds", f"--divergence={spelling}", "--p", "0.2", "0.7"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"Band of {name} at delta = 0.05")
    lower, upper = band(np.log([0.2, 0.7]), spelling, 0.05)
    rows = _rows(out)
    np.testing.assert_allclose([row[1] for row in rows], lower, rtol=1e-5)
    np.testing.assert_allclose([row[2] for row in rows], upper, rtol=1e-5)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--divergence", "nope"], ["--divergence", "unknown divergence"]),
        (["--p", "0"], ["--p"]),
        (["--p", "1.5"], ["--p"]),
        (["--p", "nan"], ["--p"]),
        (["--p", "0.5", "nan"], ["--p", "nan"]),
        (["--delta", "nan"], ["--delta"]),
        (["--delta", "-1"], ["--delta"]),
        (["--delta", "0"], ["--delta"]),
        (["--eps", "2"], ["--eps"]),
        (["--eps", "nan"], ["--eps"]),
        (["--divergence=1-u**2"], ["--divergence", "convex"]),
        (["--divergence=sin(u)"], ["--divergence"]),
        (["--p", "x"], ["--p"]),
    ],
)
def test_bad_values_are_one_line_usage_errors(capsys, args, names):
    assert main(["bounds", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("bandcore bounds: error: ")
    assert "Traceback" not in captured.err
    for name in names:
        assert name in lines[0]

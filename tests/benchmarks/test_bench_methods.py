"""``bandcore bench``'s methods and inputs: the published solver on float32 as trainers run it (its arithmetic and
accuracy) and on float64, ``band()`` with its default backend, a user's first call in a fresh process, and the
``flat`` distribution."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bandcore.oracle import reference_band_log
from benchmarks.first_call import NEXT_CALLS, measure_first_call
from benchmarks.inputs import DISTRIBUTIONS, flat_log_probs, log_probs
from benchmarks.methods import methods_for
from benchmarks.published import published_band

ROOT = Path(__file__).resolve().parents[2]


def test_flat_distribution_is_minus_uniform_0_20():
    x = flat_log_probs(200_000, seed=2)
    assert x.dtype == np.float32 and tuple(DISTRIBUTIONS) == ("llm", "mid", "flat")
    np.testing.assert_array_equal(x, log_probs("flat", 200_000, 2))
    assert not np.array_equal(x, flat_log_probs(200_000, seed=3))
    assert -20 <= x.min() < -19.99 and -0.01 < x.max() <= 0
    u = -x.astype(np.float64)  # U(0, 20): mean 10, P(U > t) = 1 - t/20
    assert 9.95 < u.mean() < 10.05 and 0.65 < np.mean(np.exp(x.astype(np.float64)) < 1e-3) < 0.66  # 1 - log(1000)/20


@pytest.mark.slow  # 10 s of 50-digit references
def test_published_solver_on_float32_has_the_accuracy_its_docstring_says():
    """Float32 in, float32 out, with the docstring's accuracy: the upper bound about eps/delta relative (the
    constraint's rounding), the lower bound a few 2^-21 absolute."""
    delta = 0.05
    log_p = np.log(np.geomspace(1e-9, 0.999, 400)).astype(np.float32)
    lo, up = published_band(torch.from_numpy(log_p), "kl", delta)
    assert lo.dtype == up.dtype == torch.float32
    exact_lo, exact_up = reference_band_log("kl", log_p.astype(np.float64), delta)
    rel_up = np.abs(up.numpy().astype(np.float64) / np.exp(exact_up) - 1)
    assert 2.0**-23 < rel_up.max() < 1.5 * 2.0**-23 / delta  # far from float64's 1e-14, within eps/delta
    abs_lo = np.abs(lo.numpy().astype(np.float64) - np.exp(exact_lo))
    assert 2.0**-21 < abs_lo.max() < 3 * 2.0**-21


def _float32_bisection(log_p: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """The published bisection written again in NumPy, every operation in float32."""
    f32 = np.float32
    p = np.exp(log_p.astype(f32))

    def feasible(r: np.ndarray) -> np.ndarray:
        q = p * r
        return p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q)) <= f32(delta)

    def bisect(lo: np.ndarray, hi: np.ndarray, upper: bool) -> np.ndarray:
        for _ in range(50):
            mid = (lo + hi) / f32(2)
            inside = feasible(mid)
            lo, hi = (np.where(inside, mid, lo), np.where(inside, hi, mid)) if upper else (
                np.where(inside, lo, mid), np.where(inside, mid, hi))  # fmt: skip
            if (hi - lo).max() < 1e-6:
                break
        return (lo + hi) / f32(2)

    one = np.ones_like(p)
    return bisect(np.zeros_like(p), one, False), bisect(one, f32(1) / p, True)


def test_the_float32_baseline_computes_in_float32(monkeypatch):
    """The ``published`` method (timed and values) evaluates the constraint on float32 tensors and agrees with a
    float32 bisection to a few float32 ulps, where the same solver in float64 is many ulps away."""
    import benchmarks.published as published

    seen = []
    kl = published._kl
    monkeypatch.setattr(published, "_kl", lambda p, q: seen.append((p.dtype, q.dtype)) or kl(p, q))
    methods = {m.name: m for m in methods_for("kl", 0.05)[0]}
    x = np.log(np.array([0.9, 0.5, 0.08, 0.01, 1e-3, 1e-4, 1e-6, 3e-9])).astype(np.float32)
    lo, up = methods["published"].timed(torch.from_numpy(x))
    assert up.dtype == torch.float32 and seen and set(seen) == {(torch.float32, torch.float32)}
    seen.clear()
    values = methods["published"].values(x.astype(np.float64))  # the accuracy path: on the points in float32
    assert set(seen) == {(torch.float32, torch.float32)} and values[1].dtype == np.float64
    np.testing.assert_array_equal(values[1], up.numpy())
    seen.clear()
    methods["published-fp64"].values(x.astype(np.float64))
    assert set(seen) == {(torch.float64, torch.float64)} and methods["published-fp64"].dtype == "float64"
    lo32, up32 = _float32_bisection(x, 0.05)
    ulps = np.abs(up.numpy() - up32) / np.spacing(up32)
    assert ulps.max() <= 4 and np.abs(lo.numpy() - lo32).max() <= 4 * np.spacing(np.float32(1))
    _, up64 = published_band(torch.from_numpy(x.astype(np.float64)), "kl", 0.05)
    assert (np.abs(up64.numpy() - up32) / np.spacing(up32)).max() > 8  # the test tells the two dtypes apart


def test_methods_of_a_divergence_in_their_order():
    """Published (float32, then float64) where it exists, band()'s default before the forced backends, tables."""
    names = ["published", "published-fp64", "auto", "numpy", "numba", "torch", "table", "table-torch"]
    assert [m.name for m in methods_for("kl", 0.05)[0]] == names
    assert [m.name for m in methods_for("hellinger", 0.05)[0]] == names[2:]


def test_auto_method_is_band_with_its_default_backend():
    from bandcore.band import band, bind

    auto = next(m for m in methods_for("js", 0.05)[0] if m.name == "auto")
    assert (auto.kind, auto.threaded, auto.torch_input, auto.contract, auto.dtype) == ("exact", True, False, 1e-12,
                                                                                       "float32")  # fmt: skip
    x = log_probs("flat", 1000, 0)
    for got, expected in zip(auto.timed(x), band(x, "js", 0.05), strict=True):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, expected)
    bound = bind("js", 0.05, log=False)
    assert auto.picks(x) == bound.pick(x.size, x.dtype) and auto.picks(log_probs("flat", 20_000, 0)) == "numba"


def test_first_call_is_measured_in_a_fresh_process(tmp_path, monkeypatch):
    """With an empty kernel cache a call below 20k tokens runs NumPy (no compile), then and after."""
    monkeypatch.setenv("BANDCORE_CACHE", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    row = measure_first_call("kl", 0.05, "flat", 1000, 0)
    assert "error" not in row, row
    assert (row["divergence"], row["distribution"], row["n_tokens"]) == ("kl", "flat", 1000)
    assert row["backend"] == row["next_backend"] == "numpy"
    assert row["first_call_seconds"] > 0 and row["next_call_seconds"] > 0 and NEXT_CALLS >= 3
    bad = measure_first_call("kl", -1.0, "flat", 10, 0)
    assert "delta" in bad["error"] and "first_call_seconds" not in bad

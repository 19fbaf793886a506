"""``bandcore bench``: the quick run writes valid JSON with every column; accuracy columns are right.

No timing is asserted anywhere."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

from bandcore.cli import main
from bandcore.oracle import reference_band_log
from bandcore.tables import rel_log_error
from bandcore.tools import bench
from bandcore.tools.bench import _accuracy_points, llm_like_log_probs
from bandcore.tools.published import published_band


def test_generator_is_llm_like_and_deterministic():
    x = llm_like_log_probs(200_000, seed=3)
    assert x.dtype == np.float32 and x.shape == (200_000,)
    np.testing.assert_array_equal(x, llm_like_log_probs(200_000, seed=3))
    p = np.exp(x.astype(np.float64))
    assert 0.73 < np.mean(p > 0.9) < 0.77  # most tokens are confident
    assert 0.04 < np.mean(p < 1e-3) < 0.06 and p.min() < 1e-9  # a heavy tail
    assert np.all(x <= 0)


def test_rel_log_error_measure():
    exact = np.array([-2.0, 0.5, -np.inf, -np.inf, 3.0, 1.0])
    approx = np.array([-2.0 * (1 + 1e-6), 0.5 + 1e-7, -np.inf, -40.0, np.nan, 1.0])
    err = rel_log_error(approx, exact)
    np.testing.assert_allclose(err[:2], [1e-6, 1e-7], rtol=1e-9)  # relative in log beyond |log r| = 1
    assert err[2] == 0 and err[3] == np.inf and err[4] == np.inf and err[5] == 0


def test_accuracy_points_cover_the_input():
    x = llm_like_log_probs(50_000, seed=0)
    pts = _accuracy_points(x, 64, seed=0)
    assert len(pts) == 64 and pts.dtype == np.float64
    np.testing.assert_array_equal(pts, pts.astype(np.float32).astype(np.float64))  # float32-representable
    assert pts.min() <= np.quantile(x, 0.01) and pts.max() >= np.quantile(x, 0.99)


def test_published_solver_error_is_bisection_sized():
    log_p = np.log(np.array([0.5, 0.08, 0.001, 0.9999]))
    lo, up = published_band(torch.from_numpy(log_p), "kl", 0.05)
    exact_lo, exact_up = reference_band_log("kl", log_p, 0.05)
    err = rel_log_error(np.log(up.numpy()), exact_up)
    assert 1e-12 < err.max() < 2e-6  # 50 halvings / tol 1e-6: not exact, not wrong
    assert rel_log_error(np.log(lo.numpy()[:2]), exact_lo[:2]).max() < 2e-6
    # KL's lower bound at p = 0.001 is e^-51: below 2^-50, bisection on [0, 1] cannot resolve it
    assert rel_log_error(np.log(lo.numpy()[2:3]), exact_lo[2:3])[0] > 0.1


def test_default_threads_are_the_cores_for_torch_and_numba():
    numba = pytest.importorskip("numba")
    expected = min(os.cpu_count() or 1, numba.config.NUMBA_NUM_THREADS)
    assert bench._resolve_threads(None) == expected
    assert bench._resolve_threads(1) == 1
    with pytest.raises(ValueError, match="threads"):
        bench._resolve_threads(numba.config.NUMBA_NUM_THREADS + 1)
    with pytest.raises(ValueError, match="threads"):
        bench._resolve_threads(0)


def test_run_bench_sets_equal_threads_and_restores_them(monkeypatch):
    numba = pytest.importorskip("numba")
    seen = {}

    def fake_run(*args):
        seen["threads"] = (torch.get_num_threads(), numba.get_num_threads(), args[7])
        return {"ok": True}

    before = (torch.get_num_threads(), numba.get_num_threads())
    monkeypatch.setattr(bench, "_run", fake_run)
    assert bench.run_bench(100, threads=1, progress=False) == {"ok": True}
    assert seen["threads"] == (1, 1, 1)
    assert (torch.get_num_threads(), numba.get_num_threads()) == before


def test_progress_bar_only_when_asked_or_on_a_tty(capsys):
    pytest.importorskip("tqdm")
    quiet = bench._Progress(3, False)
    quiet.step("a")
    quiet.close()
    auto = bench._Progress(3, None)  # pytest's stderr is not a terminal: no bar
    auto.step("a")
    auto.close()
    assert capsys.readouterr().err == ""
    shown = bench._Progress(2, True)
    shown.step("kl: numba", 2)
    shown.close()
    assert "bench: " in capsys.readouterr().err  # tqdm redraws at most every 0.1 s: the first frame only


@pytest.mark.parametrize("args", [["--threads", "0"], ["--n", "0"], ["--delta", "nan"], ["--repeats", "-1"]])
def test_bench_usage_errors_are_one_line(capsys, args):
    assert main(["bench", "--quiet", "--no-memory", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("bandcore bench: error: ") and args[0] in err[0]


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    assert main(["bench", "--quick", "--quiet", "--threads", "1", "--json", str(path)]) == 0
    return json.loads(path.read_text())


@pytest.mark.slow
def test_quick_bench_json_has_every_column(quick_report):
    r = quick_report
    for key in ("n_tokens", "delta", "seed", "machine", "copy", "results", "memory", "tables", "accuracy_points"):
        assert key in r
    assert r["threads"] == 1 and r["machine"]["torch_threads"] == 1
    assert r["machine"]["numba_threads"] in (1, None)  # None: Numba not installed
    assert not r["unavailable"], r["unavailable"]
    assert r["copy"]["roofline_mtok_s"] > 0 and r["copy"]["bytes_per_token"] == 12
    methods = {(row["divergence"], row["method"]) for row in r["results"]}
    for div in ("kl", "tv", "pearson"):
        assert {(div, m) for m in ("published", "numpy", "numba", "torch", "table", "table-torch")} <= methods
    for row in r["results"]:
        assert row["seconds"] > 0 and row["first_call_seconds"] > 0
        assert math.isclose(row["mtok_s"], r["n_tokens"] / row["seconds"] / 1e6)
        assert row["speedup_vs_published"] is not None
        assert row["max_rel_err"] == max(row["max_rel_err_lower"], row["max_rel_err_upper"])
        if row["method"] in ("numpy", "numba", "torch"):
            assert row["max_rel_err"] <= 1e-12  # the contract
        if row["method"].startswith("table"):
            assert row["max_rel_err"] <= r["tables"][row["divergence"]]["certified_max_rel_error"]
    assert {m["method"] for m in r["memory"]} == {"numba", "torch", "table"}
    table_mem = next(m for m in r["memory"] if m["method"] == "table")
    assert table_mem["peak_extra_bytes"] > 0 and 0 < table_mem["peak_over_outputs"] < 10


@pytest.mark.slow
def test_quick_bench_accuracy_columns_are_recomputable(quick_report):
    r = quick_report
    x = llm_like_log_probs(r["n_tokens"], r["seed"])
    pts = _accuracy_points(x, r["accuracy_points"], r["seed"])
    exact_lo, exact_up = reference_band_log("kl", pts, r["delta"])
    lo, up = published_band(torch.from_numpy(pts), "kl", r["delta"])
    with np.errstate(divide="ignore"):
        err_lo = rel_log_error(np.log(lo.numpy()), exact_lo).max()
        err_up = rel_log_error(np.log(up.numpy()), exact_up).max()
    row = next(row for row in r["results"] if row["divergence"] == "kl" and row["method"] == "published")
    assert row["max_rel_err_lower"] == err_lo and row["max_rel_err_upper"] == err_up


@pytest.mark.slow
def test_gpu_check_script_runs_on_cpu(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, str(root / "scripts" / "gpu_check.py"), "--device", "cpu", "--n", "4096"]
    cmd += ["--compile-backend", "eager"]  # inductor / aot_eager code generation takes minutes on a CPU
    proc = subprocess.run([*cmd, "--points", "6", "--json", str(out)], capture_output=True, text=True, env=env)
    report = json.loads(out.read_text())
    failed = [c for c in report["checks"] if not c["ok"]]
    assert proc.returncode == 0 and not failed, failed
    assert {"table_torch_kl", "band_log_torch_kl", "copy"} <= set(report["throughput"])

"""``bandcore bench``: the quick run writes JSON with every row and the Markdown made from it; the ratios come from
the measured times, the errors meet the contracts, the copy is out of cache.  No timing is asserted anywhere."""

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
from bandcore.tools.bench_report import format_markdown
from bandcore.tools.bench_timing import FALLBACK_LLC_BYTES, last_level_cache, time_call
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


def test_run_bench_sets_equal_threads_and_restores_them():
    numba = pytest.importorskip("numba")
    before = (torch.get_num_threads(), numba.get_num_threads())
    report = bench.run_bench(
        500, divergences=("tv",), repeats=1, oracle_points=4, memory_sizes=(), threads=1, progress=False
    )
    assert report["threads"] == 1 and report["machine"]["torch_threads"] == 1
    assert report["machine"]["numba_threads"] == 1
    assert (torch.get_num_threads(), numba.get_num_threads()) == before
    assert report["command"].startswith("bandcore.tools.bench.run_bench(sizes=(500,)")


def test_time_call_counts_the_first_call_apart():
    calls = []
    timing = time_call(lambda: calls.append(1), repeats=3, min_seconds=0.001)
    assert set(timing) == {"first_call_seconds", "seconds", "calls_per_repeat"}
    assert timing["seconds"] > 0 and timing["calls_per_repeat"] >= 1
    assert len(calls) == 2 + 3 * timing["calls_per_repeat"]  # first, the estimate, then the timed repeats


def test_last_level_cache_is_read_from_sysfs_files(tmp_path):
    for index, (level, kind, size) in enumerate([(1, "Data", "48K"), (1, "Instruction", "32K"), (2, "Unified", "2048K"),
                                                 (3, "Unified", "36M")]):  # fmt: skip
        folder = tmp_path / f"index{index}"
        folder.mkdir()
        (folder / "level").write_text(f"{level}\n")
        (folder / "type").write_text(f"{kind}\n")
        (folder / "size").write_text(f"{size}\n")
    llc = last_level_cache(tmp_path)
    assert llc == {"bytes": 36 * 2**20, "level": 3, "source": f"{tmp_path}/index*/size"}
    (tmp_path / "index3" / "size").write_text("garbage\n")  # unreadable entries are skipped
    assert last_level_cache(tmp_path)["bytes"] == 2 * 2**20


def test_last_level_cache_falls_back_with_a_note(tmp_path):
    llc = last_level_cache(tmp_path / "missing")
    if llc["source"] == "fallback":  # no sysconf either
        assert llc["bytes"] == FALLBACK_LLC_BYTES == 32 * 2**20 and "assumed 32 MiB" in llc["note"]
    else:
        assert llc["source"].startswith("os.sysconf") and llc["bytes"] > 0


@pytest.mark.parametrize(
    "args", [["--threads", "0"], ["--n", "0"], ["--n", "100", "-5"], ["--delta", "nan"], ["--repeats", "-1"]]
)
def test_bench_usage_errors_are_one_line(capsys, args):
    assert main(["bench", "--quiet", "--no-memory", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("bandcore bench: error: ") and args[0] in err[0]


def test_bench_missing_files_fail_before_the_run(capsys, tmp_path):
    assert main(["bench", "--quiet", "--json", str(tmp_path / "no" / "b.json")]) == 1
    assert "--json: directory" in capsys.readouterr().err
    assert main(["bench", "--from-json", str(tmp_path / "absent.json")]) == 1
    assert "absent.json" in capsys.readouterr().err


QUICK = ["bench", "--quick", "--quiet", "--published-single-thread"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    argv = [*QUICK, "--json", str(folder / "bench.json"), "--markdown", str(folder / "bench.md")]
    assert main(argv) == 0
    return json.loads((folder / "bench.json").read_text()), (folder / "bench.md").read_text(), folder


@pytest.mark.slow
def test_quick_bench_json_has_every_row_at_equal_threads(quick_run):
    r, _, _ = quick_run
    for key in ("sizes", "delta", "seed", "machine", "copy", "results", "memory", "tables", "accuracy_points",
                "command", "threads", "thread_note"):  # fmt: skip
        assert key in r
    threads = bench._resolve_threads(None)
    assert r["threads"] == threads == r["machine"]["torch_threads"]
    assert r["machine"]["numba_threads"] in (threads, None)  # None: Numba not installed
    assert f"set to {threads} thread(s)" in r["thread_note"]
    serial = threads > 1 and min(r["sizes"]) <= r["numba_serial_max"]  # small calls run on one thread: said
    assert ("run serially" in r["thread_note"]) == serial
    assert len(r["machine"]["load_average_start"]) == len(r["machine"]["load_average_end"]) == 3  # Linux
    assert not r["unavailable"], r["unavailable"]
    assert r["sizes"] == [20_000, 1_000]
    rows = {(row["divergence"], row["method"], row["n_tokens"]): row for row in r["results"]}
    methods = ("published", "published-1t", "numpy", "numba", "torch", "table", "table-torch", "roofline")
    assert set(rows) == {(d, m, n) for d in ("kl", "tv", "pearson") for m in methods for n in r["sizes"]}
    for (_, method, _), row in rows.items():
        expected = 1 if method in ("numpy", "published-1t") else threads  # everything else at equal threads
        assert row["threads"] == expected, (method, row["threads"])
    assert {m["method"] for m in r["memory"]} == {"numba", "torch", "table"}


@pytest.mark.slow
def test_quick_bench_copy_is_out_of_cache(quick_run):
    copy = quick_run[0]["copy"]
    assert copy["array_bytes"] >= 4 * copy["llc"]["bytes"] and copy["bytes_per_token"] == 12
    assert {"numpy", "torch"} <= set(copy["methods"]) and copy["methods"]["numpy"]["threads"] == 1
    for method in copy["methods"].values():
        assert math.isclose(method["gb_per_s"], 2 * copy["array_bytes"] / method["seconds"] / 1e9)
    assert copy["gb_per_s"] == max(m["gb_per_s"] for m in copy["methods"].values())
    assert math.isclose(copy["roofline_mtok_s"], copy["gb_per_s"] * 1e9 / 12 / 1e6)


@pytest.mark.slow
def test_quick_bench_ratios_come_from_the_measured_times(quick_run):
    r, _, _ = quick_run
    roofline = r["copy"]["roofline_mtok_s"]
    for row in r["results"]:
        n = row["n_tokens"]
        same = [x for x in r["results"] if x["divergence"] == row["divergence"] and x["n_tokens"] == n]
        published = next(x["seconds"] for x in same if x["method"] == "published")
        best_exact = min(x["seconds"] for x in same if x["kind"] == "exact")
        assert row["seconds"] > 0
        assert math.isclose(row["mtok_s"], n / row["seconds"] / 1e6)
        assert math.isclose(row["roofline_fraction"], row["mtok_s"] / roofline)
        assert math.isclose(row["speedup_vs_published"], published / row["seconds"])
        assert math.isclose(row["speedup_vs_best_exact"], best_exact / row["seconds"])
        if row["kind"] == "roofline":
            assert math.isclose(row["seconds"], n * 12 / (r["copy"]["gb_per_s"] * 1e9))
            assert row["max_rel_err"] is None and row["first_call_seconds"] is None
        else:
            assert row["first_call_seconds"] > 0 and row["calls_per_repeat"] >= 1


@pytest.mark.slow
def test_quick_bench_errors_are_within_the_contracts(quick_run):
    r, _, _ = quick_run
    for row in r["results"]:
        if row["kind"] == "roofline":
            continue
        assert row["max_rel_err"] == max(row["max_rel_err_lower"], row["max_rel_err_upper"])
        if row["kind"] == "exact":
            assert row["contract"] == 1e-12 and row["max_rel_err"] <= 1e-12 and row["within_contract"] is True
        elif row["kind"] == "table":
            certified = r["tables"][row["divergence"]]["certified_max_rel_error"]
            assert row["contract"] == certified and row["max_rel_err"] <= certified and row["within_contract"]
        else:
            assert row["contract"] is None and row["within_contract"] is None


@pytest.mark.slow
def test_quick_bench_accuracy_columns_are_recomputable(quick_run):
    r, _, _ = quick_run
    x = llm_like_log_probs(max(r["sizes"]), r["seed"])
    pts = _accuracy_points(x, r["accuracy_points"], r["seed"])
    exact_lo, exact_up = reference_band_log("kl", pts, r["delta"])
    lo, up = published_band(torch.from_numpy(pts), "kl", r["delta"])
    with np.errstate(divide="ignore"):
        err_lo = rel_log_error(np.log(lo.numpy()), exact_lo).max()
        err_up = rel_log_error(np.log(up.numpy()), exact_up).max()
    for row in r["results"]:
        if row["divergence"] == "kl" and row["method"].startswith("published"):
            assert row["max_rel_err_lower"] == err_lo and row["max_rel_err_upper"] == err_up


@pytest.mark.slow
def test_quick_bench_markdown_is_generated_from_the_json(quick_run, capsys):
    r, markdown, folder = quick_run
    command = "bandcore " + " ".join([*QUICK, "--json", str(folder / "bench.json"), "--markdown",
                                      str(folder / "bench.md")])  # fmt: skip
    assert r["command"] == command and f"Command: `{command}`" in markdown
    table = [line for line in markdown.splitlines() if line.startswith("| kl | ") and line.count("|") == 12]
    assert len(table) == 8  # published, published 1 thread, 3 exact backends, 2 table paths, roofline
    numba = next(line for line in table if "exact, Numba" in line).split(" | ")
    row = next(x for x in r["results"] if (x["divergence"], x["method"], x["n_tokens"]) == ("kl", "numba", 20_000))
    assert math.isclose(float(numba[3].replace(",", "")), row["seconds"] * 1e3, rel_tol=0.01)  # 3 digits
    assert numba[2] == str(r["threads"])
    assert "≤ 1.0e-12 (contract): ok" in numba[-1]
    assert format_markdown(r) == markdown
    again = folder / "again.md"
    assert main(["bench", "--from-json", str(folder / "bench.json"), "--markdown", str(again)]) == 0
    assert again.read_text() == markdown
    assert "kl         numba" in capsys.readouterr().out


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


@pytest.mark.slow
def test_spread_over_runs_reports_median_and_range(quick_run, tmp_path, capsys):
    """``--from-json A B C``: each time and ratio as median [min – max] over the runs (here one run and two
    copies of it, made 2× and 3× slower in the published solver only), worst error, every run's verdict.

    The times are set to exact binary fractions first (published KL 2 s, other published rows 1 s, every
    bandcore row 1/8 s), so the ratios checked are exact numbers, not the speed of the machine running the test."""
    r, _, _ = quick_run
    names = []
    for k, factor in enumerate((1.0, 2.0, 3.0)):
        run = json.loads(json.dumps(r))
        run["seed"] = k
        for row in run["results"]:
            if row["method"] == "published":
                row["seconds"] = (2.0 if row["divergence"] == "kl" else 1.0) * factor
            else:
                row["seconds"] = 0.125
        for row in run["results"]:
            if row["speedup_vs_published"] is not None:
                publ = next(x for x in run["results"] if (x["divergence"], x["method"], x["n_tokens"])
                            == (row["divergence"], "published", row["n_tokens"]))  # fmt: skip
                row["speedup_vs_published"] = publ["seconds"] / row["seconds"]
        names.append(tmp_path / f"run{k}.json")
        names[-1].write_text(json.dumps(run))
    out = tmp_path / "spread.md"
    assert main(["bench", "--from-json", *map(str, names), "--markdown", str(out)]) == 0
    markdown = out.read_text()
    assert markdown == capsys.readouterr().out
    assert markdown.startswith("3 runs of `bandcore bench`") and markdown.count("(seed ") == 3
    numba = next(line for line in markdown.splitlines() if line.startswith("| kl | exact, Numba | 3 |"))
    row = next(x for x in r["results"] if (x["divergence"], x["method"], x["n_tokens"]) == ("kl", "numba", 20_000))
    assert row["speedup_vs_published"] is not None
    cells = numba.split(" | ")
    for column in (4, 5):  # × published, × published KL: the same for KL (16×, 32×, 48×)
        median, low, high = (float(v.strip("×[]")) for v in cells[column].replace("–", " ").split())
        assert (median, low, high) == (32.0, 16.0, 48.0)
    tv = next(line for line in markdown.splitlines() if line.startswith("| tv | exact, Numba | 3 |")).split(" | ")
    assert tv[5].count("×") == 3 and tv[5] != tv[4]  # TV's own published closed form and the published KL
    assert cells[-1].strip(" |") == "ok"
    bad = json.loads(names[2].read_text())
    bad["delta"] = 0.1
    names[2].write_text(json.dumps(bad))
    assert main(["bench", "--from-json", *map(str, names)]) == 2
    err = capsys.readouterr().err
    assert "run2.json has delta = 0.1" in err and "run0.json has 0.05" in err


def test_table_rows_use_the_numba_kernel_at_every_size(monkeypatch):
    """The table rows are labelled "Numba kernel": also at 10k tokens, where ``backend="auto"`` would read
    NumPy input with the NumPy kernel."""
    import bandcore.tables.evaluate as evaluate
    from bandcore.tools.bench_methods import _tables

    seen = []
    run_lookup = evaluate.run_lookup

    def recording(*args):
        seen.append(args[-1])
        return run_lookup(*args)

    methods, _ = _tables("kl", 0.05, 1)  # (loading the table spot-checks it with NumPy)
    monkeypatch.setattr(evaluate, "run_lookup", recording)
    x = np.log(np.linspace(0.01, 0.99, 100))
    for method in methods:
        method.timed(torch.from_numpy(x) if method.torch_input else x)
        method.logs(x)
    assert seen == ["numba"] * 4

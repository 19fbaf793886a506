"""``bandcore bench``: interleaved rounds in the order said, medians and ratios computed from the times in the
report (over the float32 baseline), the token distributions, every row and block (the float64 published run and
``band()``'s default among them), a user's first calls, the user generators' nearest catalogue divergence, the
JSON and the Markdown made from it.  No measured speed is asserted anywhere: the runs checked number by number use an
injected fake clock, or have their times set to exact binary fractions before the ratios are derived."""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bandcore.cli import main
from bandcore.oracle import reference_band_log
from bandcore.tables import rel_log_error
from benchmarks import bench
from benchmarks import cost as bench_cost
from benchmarks.cost import nearest_in_cost, transcendental_count
from benchmarks.inputs import accuracy_points, llm_like_log_probs, log_probs, mid_log_probs
from benchmarks.memory import measure_memory
from benchmarks.published import published_band
from benchmarks.report import format_markdown, ns
from benchmarks.threads import resolve_threads
from benchmarks.timing import FALLBACK_LLC_BYTES, interleaved, last_level_cache, summarise, time_call

TOOLS = Path(bench.__file__).resolve().parent


# ------------------------------------------------------------------------------------------------------------
# Inputs, accuracy measure, the published solver
# ------------------------------------------------------------------------------------------------------------


def test_generator_is_llm_like_and_deterministic():
    x = llm_like_log_probs(200_000, seed=3)
    assert x.dtype == np.float32 and x.shape == (200_000,)
    np.testing.assert_array_equal(x, llm_like_log_probs(200_000, seed=3))
    p = np.exp(x.astype(np.float64))
    assert 0.73 < np.mean(p > 0.9) < 0.77  # most tokens are confident
    assert 0.04 < np.mean(p < 1e-3) < 0.06 and p.min() < 1e-9  # a heavy tail
    assert np.all(x <= 0)


def test_mid_distribution_is_minus_two_exponential():
    x = mid_log_probs(200_000, seed=1)
    assert x.dtype == np.float32 and np.all(x <= 0)
    np.testing.assert_array_equal(x, log_probs("mid", 200_000, 1))
    e = -x.astype(np.float64) / 2  # Exp(1): mean 1, P(E > t) = e^-t
    assert 0.99 < e.mean() < 1.01 and 0.49 < np.mean(e > math.log(2)) < 0.51  # median p = e^(-2 log 2) = 1/4
    with pytest.raises(ValueError, match="llm, mid, flat"):
        log_probs("uniform", 10, 0)


def test_rel_log_error_measure():
    exact = np.array([-2.0, 0.5, -np.inf, -np.inf, 3.0, 1.0])
    approx = np.array([-2.0 * (1 + 1e-6), 0.5 + 1e-7, -np.inf, -40.0, np.nan, 1.0])
    err = rel_log_error(approx, exact)
    np.testing.assert_allclose(err[:2], [1e-6, 1e-7], rtol=1e-9)  # relative in log beyond |log r| = 1
    assert err[2] == 0 and err[3] == np.inf and err[4] == np.inf and err[5] == 0


def test_accuracy_points_cover_the_input():
    x = llm_like_log_probs(50_000, seed=0)
    pts = accuracy_points(x, 64, seed=0)
    assert len(pts) == 64 and pts.dtype == np.float64
    np.testing.assert_array_equal(pts, pts.astype(np.float32).astype(np.float64))  # float32-representable
    assert pts.min() <= np.quantile(x, 0.01) and pts.max() >= np.quantile(x, 0.99)


def test_published_solver_error_is_bisection_sized():
    log_p = np.log(np.array([0.5, 0.08, 0.001, 0.9999]))
    lo, up = published_band(torch.from_numpy(log_p), "kl", 0.05)
    assert lo.dtype == up.dtype == torch.float64
    exact_lo, exact_up = reference_band_log("kl", log_p, 0.05)
    err = rel_log_error(np.log(up.numpy()), exact_up)
    assert 1e-12 < err.max() < 2e-6  # 50 halvings / tol 1e-6: not exact, not wrong
    assert rel_log_error(np.log(lo.numpy()[:2]), exact_lo[:2]).max() < 2e-6
    # the lower bisection stops after 20 halvings (2^-20 < 1e-6): within 2^-21 of the root, which for KL at
    # p = 0.001 is e^-51, so the bound comes out as 2^-21
    np.testing.assert_array_less(np.abs(lo.numpy() - np.exp(exact_lo)), 2.0**-21 * (1 + 1e-9))
    assert lo.numpy()[2] == 2.0**-21


# ------------------------------------------------------------------------------------------------------------
# Timing: interleaving, medians (a fake clock: its readings are the unit's input)
# ------------------------------------------------------------------------------------------------------------


class FakeClock:
    """A clock that moves only when a timed function says it ran (by ``cost`` seconds)."""

    def __init__(self):
        self.now = 0.0
        self.log = []

    def __call__(self) -> float:
        return self.now

    def entry(self, name: str, cost: float):
        def run():
            self.log.append(name)
            self.now += cost

        def setup():
            self.log.append(f"setup {name}")

        return name, run, setup


def test_interleaved_runs_the_rounds_in_order_and_keeps_every_round():
    clock = FakeClock()
    entries = [clock.entry("A", 0.25), clock.entry("B", 0.5), clock.entry("C", 2.0)]
    timed = interleaved(entries, rounds=3, min_seconds=1.0, timer=clock)
    # calls per batch: enough to last min_seconds (from one call each): A 4, B 2, C 1
    assert {k: v["calls_per_round"] for k, v in timed.items()} == {"A": 4, "B": 2, "C": 1}
    sizing = ["setup A", "A", "setup B", "B", "setup C", "C"]
    one_round = ["setup A", *"AAAA", "setup B", *"BB", "setup C", "C"]
    assert clock.log == sizing + one_round * 3  # A B C A B C A B C, every batch after its setup
    assert timed["A"]["rounds"] == [0.25] * 3 and timed["B"]["rounds"] == [0.5] * 3
    assert timed["C"]["rounds"] == [2.0] * 3
    with pytest.raises(ValueError, match="rounds"):
        interleaved(entries, rounds=0, min_seconds=1.0, timer=clock)


def test_summarise_gives_median_quartiles_and_range():
    assert summarise([5.0, 1.0, 4.0, 2.0, 3.0]) == {"median": 3.0, "q1": 2.0, "q3": 4.0, "min": 1.0, "max": 5.0}
    assert summarise([1.0, 2.0, 3.0, 10.0]) == {"median": 2.5, "q1": 1.75, "q3": 4.75, "min": 1.0, "max": 10.0}
    assert summarise([0.5]) == dict.fromkeys(("median", "q1", "q3", "min", "max"), 0.5)
    with pytest.raises(ValueError):
        summarise([])


def test_time_call_counts_the_first_call_apart():
    calls = []
    timing = time_call(lambda: calls.append(1), repeats=3, min_seconds=0.001)
    assert set(timing) == {"first_call_seconds", "seconds", "calls_per_repeat"}
    assert timing["seconds"] > 0 and timing["calls_per_repeat"] >= 1
    assert len(calls) == 2 + 3 * timing["calls_per_repeat"]  # first, the estimate, then the timed repeats


# ------------------------------------------------------------------------------------------------------------
# Cost of a generator
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("divergence", "count"),
    [("kl", 1), ("tv", 0), ("pearson", 0), ("neyman", 0), ("hellinger", 1), ("js", 2), ("alpha(0.5)", 1),
     ("alpha(-1)", 0), ("alpha(3)", 0), ("(u-1)*log(u)", 1), ("(u-1)**4", 0), ("u**u - 1", 1),
     ("log(u)**2 + exp(u - 1) - u", 2), ("where(u < 1, cosh(u - 1) - 1, (u - 1)**2)", 1)],
)  # fmt: skip
def test_transcendental_count_reads_the_parsed_tree(divergence, count):
    assert transcendental_count(divergence) == count


def test_nearest_in_cost_prefers_the_closest_count_then_the_faster():
    catalogue = {"kl": (1, 3.0), "hellinger": (1, 2.0), "tv": (0, 0.5), "js": (2, 1.0)}
    assert nearest_in_cost(1, catalogue) == "hellinger"  # kl and hellinger tie: the faster
    assert nearest_in_cost(0, catalogue) == "tv"
    assert nearest_in_cost(5, catalogue) == "js"  # the closest count even if others are faster
    assert nearest_in_cost(1, {}) is None


# ------------------------------------------------------------------------------------------------------------
# A run on the fake clock: the report's shape and every derived number, exactly
# ------------------------------------------------------------------------------------------------------------

TICK = 2.0**-10  # each reading of the run's clock moves it by one tick: every batch lasts exactly one tick


def _ticking_clock():
    counter = itertools.count()
    return lambda: next(counter) * TICK


@pytest.fixture(scope="module")
def clock_run():
    numba = pytest.importorskip("numba")
    threads = min(2, numba.config.NUMBA_NUM_THREADS)
    before = (torch.get_num_threads(), numba.get_num_threads())
    report = bench.run_bench(
        (300, 100), divergences=("kl", "tv"), rounds=3, min_round_seconds=TICK, oracle_points=8, memory_sizes=(),
        first_calls=False, threads=threads, progress=False, timer=_ticking_clock(),
    )  # fmt: skip
    assert (torch.get_num_threads(), numba.get_num_threads()) == before  # restored
    return report


def test_clock_run_has_every_row_and_block(clock_run):
    r = clock_run
    distributions = ("llm", "mid", "flat")
    assert tuple(r["distributions"]) == distributions and r["baseline_dtype"] == "float32"
    assert set(r["generators"]) == set(distributions) and not r["unavailable"], r["unavailable"]
    methods = {"kl": ["published", "published-fp64", "auto", "numpy", "numba", "torch", "table", "table-torch"]}
    methods["tv"] = methods["kl"]
    keys = {(row["distribution"], row["divergence"], row["method"], row["n_tokens"]) for row in r["results"]}
    assert keys == {(d, v, m, n) for d in distributions for v in ("kl", "tv") for m in [*methods[v], "exp_pass"]
                    for n in (300, 100)}  # fmt: skip
    assert len(r["results"]) == len(keys)
    threaded = [m for m in methods["kl"] if m != "numpy"]
    expected = [f"{m}@1" for m in methods["kl"]] + ["exp_pass@1"]
    if r["threads"] > 1:
        expected += [f"{m}@{r['threads']}" for m in threaded]
    assert len(r["blocks"]) == 12 and all(block["order"] == expected for block in r["blocks"])
    assert r["command"].startswith("benchmarks.bench.run_bench(sizes=(300, 100)")
    assert "first_calls=False" in r["command"] and r["first_calls"] == []
    dtypes = {row["method"]: row["input_dtype"] for row in r["results"]}
    assert dtypes["published"] == "float32" and dtypes["published-fp64"] == dtypes["exp_pass"] == "float64"
    assert {dtypes[m] for m in methods["kl"] if m != "published-fp64"} == {"float32"}


def test_clock_run_auto_runs_the_kernel_the_run_made_ready(clock_run):
    """Only band()'s default picks its backend; after the block's forced Numba call its kernel is ready, so the
    timed rounds of the default run Numba even on 100 tokens (a fresh process would run NumPy there)."""
    picked = {(row["method"], row["picked_backend"]) for row in clock_run["results"] if "picked_backend" in row}
    assert picked == {("auto", "numba")}


def test_clock_run_times_are_the_clock_readings(clock_run):
    r = clock_run
    for row in r["results"]:
        for key in ("1", "all"):
            times = row["times"][key]
            assert times["rounds"] == [TICK] * 3 and times["calls_per_round"] == 1
            assert times["median"] == times["min"] == times["max"] == TICK and times["first_call_seconds"] == TICK
            assert row["ns_per_token"][key] == 1e9 * TICK / row["n_tokens"]
            assert row["x_exp_pass"][key] == 1.0
            assert row["speedup_vs_published"][key] == 1.0 and row["speedup_vs_published_kl"][key] == 1.0
        one_thread = row["method"] in ("numpy", "exp_pass")
        assert row["times"]["1"]["threads"] == 1
        assert row["times"]["all"]["threads"] == (1 if one_thread else r["threads"])


def _set_medians(report, medians):
    """Every row's medians (per thread key) from ``medians(row, key)``."""
    for row in report["results"]:
        for key in ("1", "all"):
            row["times"][key]["median"] = medians(row, key)


def _exact_times(row, key):
    """Exact binary fractions: published (float32) 2 s (KL) or 1 s (TV) on 1 thread, half that on all, and on
    float64 twice as long; exp pass 1/8 s; numba 1/32 s on 1 thread, 1/64 on all; every other row 1/4 s; the
    100-token block twice as fast."""
    scale = 0.5 if row["n_tokens"] == 100 else 1.0
    if row["kind"] == "published":
        value = (2.0 if row["divergence"] == "kl" else 1.0) * (2 if row["method"] == "published-fp64" else 1)
        return scale * (value if key == "1" else value / 2)
    if row["method"] == "exp_pass":
        return scale / 8
    if row["method"] == "numba":
        return scale * (1 / 32 if key == "1" else 1 / 64)
    return scale / 4


def test_ratios_are_medians_over_medians(clock_run):
    r = json.loads(json.dumps(clock_run))
    _set_medians(r, _exact_times)
    bench.derive_ratios(r)
    rows = {(x["distribution"], x["divergence"], x["method"], x["n_tokens"]): x for x in r["results"]}
    kl = rows["mid", "kl", "numba", 300]
    assert kl["speedup_vs_published"] == {"1": 64.0, "all": 64.0} == kl["speedup_vs_published_kl"]
    assert kl["x_exp_pass"] == {"1": 0.25, "all": 0.125}
    assert kl["ns_per_token"]["all"] == 1e9 / 64 / 300
    tv = rows["llm", "tv", "numba", 100]
    assert tv["speedup_vs_published"] == {"1": 32.0, "all": 32.0} and tv["speedup_vs_published_kl"]["1"] == 64.0
    assert rows["llm", "tv", "torch", 300]["speedup_vs_published"] == {"1": 4.0, "all": 2.0}
    # over the float32 baseline, not the float64 run beside it: that one is 0.5x the baseline
    assert rows["flat", "kl", "published-fp64", 300]["speedup_vs_published"] == {"1": 0.5, "all": 0.5}
    assert rows["flat", "tv", "published-fp64", 100]["speedup_vs_published_kl"] == {"1": 1.0, "all": 1.0}
    assert all("nearest_catalogue" not in row for row in r["results"])  # only user generators get one


def test_user_generator_gets_the_nearest_catalogue_divergence(clock_run):
    """A user generator's rows (copied from KL's, renamed) beside the catalogue divergence of the same run with
    the closest transcendental count, ties to the faster: (u-1)*log(u) has 1 like KL (TV has 0)."""
    r = json.loads(json.dumps(clock_run))
    user = "(u-1)*log(u)"
    r["divergences"] = [*r["divergences"], user]
    copied = [row for row in clock_run["results"] if row["divergence"] == "kl" and row["kind"] != "published"]
    r["results"] += [{**json.loads(json.dumps(row)), "divergence": user} for row in copied]
    _set_medians(r, lambda row, key: 0.75 if row["divergence"] == user else _exact_times(row, key))
    bench.derive_ratios(r)
    numba = next(x for x in r["results"] if (x["divergence"], x["method"], x["n_tokens"], x["distribution"])
                 == (user, "numba", 300, "llm"))  # fmt: skip
    assert numba["transcendentals"] == 1
    assert numba["nearest_catalogue"]["1"] == {"divergence": "kl", "transcendentals": 1, "ratio": 24.0}
    assert numba["nearest_catalogue"]["all"]["ratio"] == 48.0
    assert numba["speedup_vs_published"] == {"1": None, "all": None}
    assert numba["speedup_vs_published_kl"]["1"] == 2 / 0.75
    for row in r["results"]:  # a tie, KL against a 1-transcendental divergence twice as fast: the faster
        if row["divergence"] == "tv":
            row["divergence"], row["transcendentals"] = "hellinger", 1
    r["divergences"] = [("hellinger" if d == "tv" else d) for d in r["divergences"]]
    _set_medians(r, lambda row, key: 0.75 if row["divergence"] == user else _exact_times(row, key) / (
        2 if row["divergence"] == "hellinger" else 1))  # fmt: skip
    bench.derive_ratios(r)
    near = numba["nearest_catalogue"]
    assert near["1"] == {"divergence": "hellinger", "transcendentals": 1, "ratio": 48.0}  # 0.75 / (1/64)
    assert near["all"]["ratio"] == 96.0
    markdown = format_markdown(r)
    assert f"| {user} | exact, Numba | 300 | 1 | hellinger (1) | 48× | hellinger (1) | 96× |" in markdown


def _first_call_row(k: int) -> dict:
    """Run k's first call of band() on 100 KL tokens: NumPy in runs 0 and 1, Numba in run 2; (k + 1)/2 s."""
    backend = "numba" if k == 2 else "numpy"
    return {"divergence": "kl", "distribution": "llm", "n_tokens": 100, "import_seconds": 0.125,
            "first_call_seconds": (k + 1) / 2, "backend": backend, "next_call_seconds": 2.0**-10,
            "next_backend": backend}  # fmt: skip


def test_spread_over_runs_reports_median_and_range(clock_run, tmp_path, capsys):
    """``--from-json A B C``: per distribution, each ratio as median [min – max] over the runs (one run and two
    copies, the published solver made 2× and 3× slower), with exact times set before the ratios are derived; the
    float32 baseline named, the float64 run and band()'s default beside it, and a user's first calls."""
    names = []
    for k, factor in enumerate((1.0, 2.0, 3.0)):
        run = json.loads(json.dumps(clock_run))
        run["seed"] = k
        run["first_calls"] = [_first_call_row(k)]
        _set_medians(run, lambda row, key, f=factor: _exact_times(row, key) * (f if row["method"] == "published"
                                                                               else 1.0))  # fmt: skip
        if k == 2:  # band()'s default ran NumPy on one block of this run
            next(row for row in run["results"] if (row["distribution"], row["divergence"], row["method"],
                 row["n_tokens"]) == ("flat", "tv", "auto", 100))["picked_backend"] = "numpy"  # fmt: skip
        bench.derive_ratios(run)
        names.append(tmp_path / f"run{k}.json")
        names[-1].write_text(json.dumps(run))
    out = tmp_path / "spread.md"
    assert main(["bench", "--from-json", *map(str, names), "--markdown", str(out)]) == 0
    markdown = out.read_text()
    assert markdown == capsys.readouterr().out
    assert markdown.startswith("3 runs of `bandcore bench`") and markdown.count("(seed ") == 3
    assert "× published float32: over the published solver computing in float32" in markdown
    for distribution in ("llm", "mid", "flat"):
        assert markdown.count(f"### Distribution `{distribution}`") == 1
    mid = markdown[markdown.index("### Distribution `mid`"):markdown.index("### Distribution `flat`")]
    head = next(line for line in mid.splitlines() if line.startswith("| divergence | method | runs |"))
    assert "| × published float32 1 thr (300) | × published float32 2 thr (300) |" in head or clock_run["threads"] == 1
    cells = next(line for line in mid.splitlines() if line.startswith("| kl | exact, Numba | 3 |")).split(" | ")
    # 300 tokens: ns/token 1e9/32/300 = 104,167 in every run; × exp pass 0.25; × published 64× [64 – 192]
    same = ns(1e9 / 32 / 300)
    assert cells[3] == f"{same} [{same} – {same}]" and cells[5] == "0.25× [0.25× – 0.25×]"
    assert cells[6] == cells[7] == "128× [64× – 192×]"
    tv = next(line for line in mid.splitlines() if line.startswith("| tv | exact, torch | 3 |")).split(" | ")
    assert tv[6] == "8.00× [4.00× – 12×]" and tv[7] == "4.00× [2.00× – 6.00×]"
    baseline = next(line for line in mid.splitlines() if line.startswith("| kl | published solver, float32 (the "
                                                                         "baseline) | 3 |")).split(" | ")  # fmt: skip
    assert baseline[6] == baseline[7] == "1.00× [1.00× – 1.00×]"
    fp64 = next(line for line in mid.splitlines() if line.startswith("| kl | published solver, float64 input | 3 |"))
    assert fp64.split(" | ")[6] == "1.00× [0.5× – 1.50×]"  # 4 s against 2, 4 and 6 s
    auto = next(line for line in mid.splitlines() if line.startswith("| kl | exact, band() default (auto) | 3 |"))
    assert auto.split(" | ")[6] == "16× [8.00× – 24×]"
    assert "band() with its default backend (auto) ran numba in every block of the timed rounds." in mid
    flat = markdown[markdown.index("### Distribution `flat`"):]
    assert ("band() with its default backend (auto) ran, in the timed rounds: kl 300: numba; kl 100: numba; "
            "tv 300: numba; tv 100: numba in 2 of 3 runs, numpy in 1 of 3 runs.") in flat
    assert "A user's first call: band(x, divergence, 0.05) with its default backend, in a fresh process" in flat
    assert "| kl | 100 | 3 | numba in 1 of 3 runs, numpy in 2 of 3 runs | 1 s [0.5 s – 1.5 s] | 0.977 ms [0.977 ms – " \
           "0.977 ms] | numba in 1 of 3 runs, numpy in 2 of 3 runs |" in flat
    bad = json.loads(names[2].read_text())
    bad["delta"] = 0.1
    names[2].write_text(json.dumps(bad))
    assert main(["bench", "--from-json", *map(str, names)]) == 2
    err = capsys.readouterr().err
    assert "run2.json has delta = 0.1" in err and "run0.json has 0.05" in err


def test_reports_saved_before_the_float32_baseline_name_theirs_float64(clock_run, tmp_path, capsys):
    """A report without ``baseline_dtype`` was made when the published solver cast its input to float64: its
    baseline is labelled so, and a spread refuses to mix it with a float32-baseline run."""
    old = json.loads(json.dumps(clock_run))
    del old["baseline_dtype"]
    bench.derive_ratios(old)
    markdown = format_markdown(old)
    assert "| kl | published solver, float64 (the baseline) |" in markdown and "× published float64 1 / " in markdown
    assert "float32 (the baseline)" not in markdown
    names = [tmp_path / "new.json", tmp_path / "old.json"]
    names[0].write_text(json.dumps(clock_run))
    names[1].write_text(json.dumps(old))
    assert main(["bench", "--from-json", *map(str, names)]) == 2
    assert "old.json's published solver computed in float64, " in capsys.readouterr().err


def test_markdown_of_a_run_names_the_baseline_and_the_default_backend(clock_run):
    r = json.loads(json.dumps(clock_run))
    r["first_calls"] = [_first_call_row(0), {"divergence": "tv", "distribution": "llm", "n_tokens": 100,
                                             "error": "ValueError: no"}]  # fmt: skip
    bench.derive_ratios(r)
    markdown = format_markdown(r)
    assert markdown.count("| kl | published solver, float32 (the baseline) |") == 3  # one per distribution
    assert markdown.count("| tv | exact, band() default (auto) |") == 3
    assert "× published (float32): over the divergence's published solver computing in float32" in markdown
    assert markdown.count("band() with its default backend (auto) ran numba in every block") == 3
    assert "| kl | 100 | numpy | 0.5 s | 0.977 ms | numpy |" in markdown
    assert "| tv | 100 | ValueError: no |  |  |  |" in markdown


# ------------------------------------------------------------------------------------------------------------
# Threads, options, files
# ------------------------------------------------------------------------------------------------------------


def test_default_threads_are_the_cores_for_torch_and_numba():
    numba = pytest.importorskip("numba")
    expected = min(os.cpu_count() or 1, numba.config.NUMBA_NUM_THREADS)
    assert resolve_threads(None) == expected
    assert resolve_threads(1) == 1
    with pytest.raises(ValueError, match="threads"):
        resolve_threads(numba.config.NUMBA_NUM_THREADS + 1)
    with pytest.raises(ValueError, match="threads"):
        resolve_threads(0)


@pytest.mark.parametrize(
    "args",
    [["--threads", "0"], ["--n", "0"], ["--n", "100", "-5"], ["--delta", "nan"], ["--rounds", "-1"],
     ["--distributions", "uniform"]],
)  # fmt: skip
def test_bench_usage_errors_are_one_line(capsys, args):
    assert main(["bench", "--quiet", "--no-memory", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("bandcore bench: error: ") and args[0] in err[0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"distributions": ("uniform",)}, "llm, mid"), ({"divergences": ("nope",)}, "nope"),
     ({"divergences": ("u**2",)}, "f\\(1\\) must be 0"), ({"rounds": 0}, "rounds"),
     ({"min_round_seconds": 0.0}, "min_round_seconds"), ({"distributions": ()}, "at least one")],
)  # fmt: skip
def test_run_bench_refuses_bad_settings_before_the_run(kwargs, message):
    with pytest.raises(ValueError, match=message):
        bench.run_bench(100, **{"memory_sizes": (), "progress": False, **kwargs})


def test_reports_of_earlier_versions_are_refused_not_misread(capsys, tmp_path):
    old = tmp_path / "old.json"  # the best-of-repeats format: no distributions, no rounds
    old.write_text(json.dumps({"sizes": [10], "delta": 0.05, "results": [{"method": "numba", "seconds": 1.0}]}))
    for argv in ([str(old)], [str(old), str(old)]):
        assert main(["bench", "--from-json", *argv]) == 2
        err = capsys.readouterr().err
        assert "old.json is not a report of this bandcore bench" in err and len(err.splitlines()) == 1


def test_bench_missing_files_fail_before_the_run(capsys, tmp_path):
    assert main(["bench", "--quiet", "--json", str(tmp_path / "no" / "b.json")]) == 1
    assert "--json: directory" in capsys.readouterr().err
    assert main(["bench", "--from-json", str(tmp_path / "absent.json")]) == 1
    assert "absent.json" in capsys.readouterr().err


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


def test_table_rows_use_the_numba_kernel_at_every_size(monkeypatch):
    """The table rows are labelled "Numba kernel": also at 10k tokens, where ``backend="auto"`` would read
    NumPy input with the NumPy kernel."""
    import bandcore.tables.evaluate as evaluate
    from benchmarks.methods import _tables

    seen = []
    run_lookup = evaluate.run_lookup

    def recording(log_p, lower, upper, out_dtype, tol, backend, ratios):
        seen.append(backend)
        return run_lookup(log_p, lower, upper, out_dtype, tol, backend, ratios)

    methods, _ = _tables("kl", 0.05)  # (loading the table spot-checks it with NumPy)
    monkeypatch.setattr(evaluate, "run_lookup", recording)
    x = np.log(np.linspace(0.01, 0.99, 100))
    for method in methods:
        method.timed(torch.from_numpy(x) if method.torch_input else x)
        method.values(x)
    assert seen == ["numba"] * 4


# ------------------------------------------------------------------------------------------------------------
# The quick run through the CLI (real clock; nothing about its speed is checked)
# ------------------------------------------------------------------------------------------------------------

QUICK = ["bench", "--quick", "--quiet"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    argv = [*QUICK, "--json", str(folder / "bench.json"), "--markdown", str(folder / "bench.md")]
    assert main(argv) == 0
    return json.loads((folder / "bench.json").read_text()), (folder / "bench.md").read_text(), folder


@pytest.mark.slow
def test_quick_bench_json_has_every_row_at_equal_threads(quick_run):
    r, _, _ = quick_run
    threads = resolve_threads(None)
    assert r["threads"] == threads == r["machine"]["torch_threads"]
    assert r["machine"]["numba_threads"] in (threads, None)  # None: Numba not installed
    assert f"on all {threads} thread(s)" in r["thread_note"] and set(r["thread_setting"]) >= {"published", "numba"}
    serial = threads > 1 and min(r["sizes"]) <= r["numba_serial_max"]  # small calls run on one thread: said
    assert ("run serially" in r["thread_note"]) == serial
    assert len(r["machine"]["load_average_start"]) == len(r["machine"]["load_average_end"]) == 3  # Linux
    assert r["machine"]["cpu_model"] and isinstance(r["machine"]["vector_extensions"], list)  # what set the unit
    assert not r["unavailable"], r["unavailable"]
    assert r["sizes"] == [20_000, 1_000] and r["distributions"] == ["llm", "mid", "flat"] and r["rounds"] == 3
    assert len(r["results"]) == 3 * 3 * 9 * 2 and r["memory"] == []  # 3 divergences, 8 methods + the exp pass
    for row in r["results"]:
        for key in ("1", "all"):
            times = row["times"][key]
            assert len(times["rounds"]) == 3 and times["median"] == summarise(times["rounds"])["median"]
            assert times["min"] <= times["q1"] <= times["median"] <= times["q3"] <= times["max"]
            assert times["first_call_seconds"] > 0 and times["calls_per_round"] >= 1


@pytest.mark.slow
def test_quick_bench_ratios_come_from_the_measured_medians(quick_run):
    r, _, _ = quick_run
    again = json.loads(json.dumps(r))
    bench.derive_ratios(again)
    assert again["results"] == r["results"]  # the derived fields are those of the medians saved
    for row in r["results"]:
        same = {x["method"]: x for x in r["results"] if (x["distribution"], x["divergence"], x["n_tokens"])
                == (row["distribution"], row["divergence"], row["n_tokens"])}  # fmt: skip
        for key in ("1", "all"):
            median = row["times"][key]["median"]
            assert row["x_exp_pass"][key] == median / same["exp_pass"]["times"]["1"]["median"]
            assert row["speedup_vs_published"][key] == same["published"]["times"][key]["median"] / median


@pytest.mark.slow
def test_quick_bench_copy_is_out_of_cache(quick_run):
    copy = quick_run[0]["copy"]
    assert copy["array_bytes"] >= 4 * copy["llc"]["bytes"] and copy["bytes_per_token"] == 12
    assert {"numpy", "torch"} <= set(copy["methods"]) and copy["methods"]["numpy"]["threads"] == 1
    for method in copy["methods"].values():
        assert math.isclose(method["gb_per_s"], 2 * copy["array_bytes"] / method["seconds"] / 1e9)
    assert copy["gb_per_s"] == max(m["gb_per_s"] for m in copy["methods"].values())


@pytest.mark.slow
def test_quick_bench_errors_are_within_the_contracts(quick_run):
    r, _, _ = quick_run
    for row in r["results"]:
        if row["kind"] == "unit":
            assert row["max_rel_err"] is None and row["contract"] is None
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
    share = max(2, r["oracle_points"] // len(r["distributions"]))
    pts = np.unique(np.concatenate([accuracy_points(log_probs(d, max(r["sizes"]), r["seed"]), share, r["seed"])
                                    for d in r["distributions"]]))  # fmt: skip
    assert len(pts) == r["accuracy_points"]
    exact_lo, exact_up = reference_band_log("kl", pts, r["delta"])
    for method, dtype in (("published", torch.float32), ("published-fp64", torch.float64)):
        lo, up = published_band(torch.from_numpy(pts).to(dtype), "kl", r["delta"])
        with np.errstate(divide="ignore"):
            err_lo = rel_log_error(np.log(lo.numpy().astype(np.float64)), exact_lo).max()
            err_up = rel_log_error(np.log(up.numpy().astype(np.float64)), exact_up).max()
        rows = [row for row in r["results"] if row["divergence"] == "kl" and row["method"] == method]
        assert len(rows) == 6 and all(row["input_dtype"] == str(dtype).removeprefix("torch.") for row in rows)
        for row in rows:
            assert row["max_rel_err_lower"] == err_lo and row["max_rel_err_upper"] == err_up


@pytest.mark.slow
def test_quick_bench_first_calls_are_measured_per_divergence_and_size(quick_run):
    r, markdown, _ = quick_run
    rows = r["first_calls"]
    assert [(row["divergence"], row["n_tokens"]) for row in rows] == [(d, n) for d in ("kl", "tv", "pearson")
                                                                      for n in (1_000, 20_000)]  # fmt: skip
    for row in rows:
        assert "error" not in row, row
        assert row["distribution"] == "llm" and row["first_call_seconds"] > 0 and row["next_call_seconds"] > 0
        assert row["backend"] == row["next_backend"] and row["backend"] in ("numpy", "numba")
        if row["n_tokens"] >= 20_000:  # AUTO_NUMBA_MIN_SIZE: Numba, compiled or loaded, whatever the cache holds
            assert row["backend"] == "numba"
    assert "A user's first call: band(x, divergence, 0.05)" in markdown
    assert {row["picked_backend"] for row in r["results"] if row["method"] == "auto"} == {"numba"}


@pytest.mark.slow
def test_quick_bench_markdown_is_generated_from_the_json(quick_run, capsys):
    r, markdown, folder = quick_run
    command = "bandcore " + " ".join([*QUICK, "--json", str(folder / "bench.json"), "--markdown",
                                      str(folder / "bench.md")])  # fmt: skip
    assert r["command"] == command and f"Command: `{command}`" in markdown
    assert format_markdown(r) == markdown
    for distribution in ("llm", "mid", "flat"):
        assert markdown.count(f"### Distribution `{distribution}`") == 1
    llm = markdown[markdown.index("### Distribution `llm`"):markdown.index("### Distribution `mid`")]
    table = [line for line in llm.splitlines() if line.startswith("| kl | ")]
    assert len(table) == 9  # published float32 and float64, band()'s default, 3 forced backends, 2 tables, exp pass
    assert table[0].startswith("| kl | published solver, float32 (the baseline) | ")
    assert "| × published float32 1 / " in llm
    numba = next(line for line in table if "exact, Numba" in line).split(" | ")
    row = next(x for x in r["results"] if (x["distribution"], x["divergence"], x["method"], x["n_tokens"])
               == ("llm", "kl", "numba", 20_000))  # fmt: skip
    assert numba[2] == ns(row["ns_per_token"]["1"]) and numba[3] == ns(row["ns_per_token"]["all"])
    assert "≤ 1.0e-12 (contract): ok" in numba[-1]
    again = folder / "again.md"
    assert main(["bench", "--from-json", str(folder / "bench.json"), "--markdown", str(again)]) == 0
    assert again.read_text() == markdown
    assert "llm  kl           numba" in capsys.readouterr().out


@pytest.mark.slow
def test_peak_memory_is_measured_in_a_subprocess():
    row = measure_memory("numba", "kl", 0.05, 100_000, 1)
    assert "error" not in row, row
    assert row["input_bytes"] == 400_000 and row["peak_over_input"] == row["peak_extra_bytes"] / 400_000


@pytest.mark.slow
def test_gpu_check_script_runs_on_cpu(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, str(root / "scripts" / "gpu_check.py"), "--device", "cpu", "--n", "4096"]
    cmd += ["--compile-backend", "eager"]  # inductor / aot_eager code generation takes minutes on a CPU
    # compiling KL's solver checks the script's plumbing; tracing the generic solver (alpha(0.5), a minute on a CPU)
    # is checked by tests/band/test_band.py::test_torch_compile (hellinger)
    cmd += ["--compile", "kl"]
    proc = subprocess.run([*cmd, "--points", "6", "--json", str(out)], capture_output=True, text=True, env=env)
    report = json.loads(out.read_text())
    failed = [c for c in report["checks"] if not c["ok"]]
    assert proc.returncode == 0 and not failed, failed
    assert {"table_torch_kl", "band_log_torch_kl", "copy"} <= set(report["throughput"])


def test_exact_rows_of_a_user_generator_sit_beside_the_same_solver(clock_run):
    """An exact row is compared with the catalogue divergences run by the same (generic) solver even when a
    dedicated one (KL's Halley solver) is closer in count; a table row with the closest count whatever solves it."""
    r = json.loads(json.dumps(clock_run))
    user = "(u-1)*log(u)"
    r["divergences"] = [*r["divergences"], user]
    copied = [row for row in clock_run["results"] if row["divergence"] == "kl" and row["kind"] != "published"]
    r["results"] += [{**json.loads(json.dumps(row)), "divergence": user} for row in copied]
    for row in r["results"]:
        if row["divergence"] == "tv":
            row["divergence"], row["transcendentals"] = "js", 5
    r["divergences"] = [("js" if d == "tv" else d) for d in r["divergences"]]
    bench.derive_ratios(r)
    chosen = {(x["method"], x["kind"]): x["nearest_catalogue"]["1"]["divergence"] for x in r["results"]
              if x["divergence"] == user and x["n_tokens"] == 300 and x["distribution"] == "llm"
              and x["kind"] != "unit"}  # fmt: skip
    assert bench_cost.solver_of(user) == bench_cost.solver_of("js") == "generic" != bench_cost.solver_of("kl")
    assert {v for (_, kind), v in chosen.items() if kind == "exact"} == {"js"}
    assert {v for (_, kind), v in chosen.items() if kind == "table"} == {"kl"}


def test_ratio_error_treats_a_rounded_underflow_or_overflow_as_exact():
    from benchmarks.bench import rel_ratio_error

    exact = np.array([-800.0, -740.0, 720.0, -1.0, -1.0, -800.0, 720.0, -50.0])
    approx = np.array([0.0, np.exp(-740.0), np.inf, np.exp(-1.0), np.exp(-1.0) * (1 + 1e-9), 2.0**-51, 1e300, 0.0])
    err = rel_ratio_error(approx, exact)
    assert err[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert err[4] == pytest.approx(1e-9, rel=1e-6)  # a normal ratio: |Δ log r| / max(1, |log r|)
    assert err[5] == pytest.approx(abs(-51 * math.log(2) + 800) / 800)  # not the rounded value: its log error
    assert err[6] > 0 and err[7] == np.inf  # a finite ratio where it overflows; 0 for a normal ratio

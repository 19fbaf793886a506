r"""``bandcore bench``: our Band solvers against the published solver, interleaved, on 1 thread and on all.

**What is timed.**  For each token distribution (:mod:`benchmarks.inputs`: ``llm``, ``mid``, ``flat``), each
divergence and each size (default 500k tokens, and 10k where per-call overhead dominates), one *block*: every
:class:`~benchmarks.methods.Method` of the divergence (the published solver where it exists, on float32 as
trainers run it and on float64; ``band()`` with its default backend as a user calls it; the exact solver with
each backend forced, NumPy, Numba and torch; the certified table on a NumPy array and on a tensor) on 1 thread
and on the run's threads, and one ``np.exp`` pass over the same tokens as float64 (the *exp pass*: the
probabilities :math:`p = e^{\log p}`), all timed in ``rounds`` interleaved rounds
(:func:`~benchmarks.timing.interleaved`: A B C … A B C …, each entry a batch of back-to-back calls lasting at
least ``min_round_seconds``).  Every entry reports the **median** of its per-call times over the rounds, with
quartiles and range (``times``); the first call (imports, Numba compilation or cache load) is excluded and
reported (``first_call_seconds``).  Every input is the float32 log-probs; ``published-fp64`` gets them cast to
float64 once, before its first call.  ``band()``'s default (``auto``) picks its backend per call; the backend it
ran in the timed rounds is the row's ``picked_backend`` (after the block's first calls, so with the kernels the
run has made ready).  **A user's first call** is measured apart, before anything of the divergence runs here: per
divergence and size (small first), ``band(x, div, delta)`` in a fresh subprocess on the run's first
distribution (:mod:`benchmarks.first_call`): what it took, which backend it ran, and the calls after it
(``first_calls``).

**Units.**  With :math:`T` a row's median time on :math:`n` tokens:

* ``ns_per_token`` :math:`= 10^9\,T/n`, on 1 thread (``"1"``) and on the run's threads (``"all"``);
* ``x_exp_pass`` :math:`= T / T_{\exp}`, :math:`T_{\exp}` the median of the exp pass of the same block: the
  time in units of one NumPy transcendental pass over the same array, which depends far less on the machine
  and on its load than a time does (both are measured in the same rounds);
* ``speedup_vs_published`` :math:`= T_{pub}/T`, :math:`T_{pub}` the **float32** published solver's median
  (the report's ``baseline_dtype``; same block, same threads) where the divergence has a published solver, and
  ``speedup_vs_published_kl``: the float32 published KL solver's median (same distribution, size and threads,
  its own block of the same run) over :math:`T`.

**Threads.**  Before each batch both torch and Numba are set to the entry's thread count
(:mod:`benchmarks.threads`), so the published solver (torch) and bandcore's torch, Numba and table
rows run on equal threads; NumPy (the NumPy backend, the exp pass) is single-threaded, and its one measurement
fills both columns.

**User generators** (formulas, not in the catalogue) get, per method, size, distribution and thread count, the
catalogue divergence of the same run nearest in cost (:mod:`benchmarks.cost`) and the ratio of the
two times (``nearest_catalogue``).

**Accuracy** is measured once per divergence, on ``oracle_points`` float64 points shared among the
distributions of the run (quantiles of each plus log-uniform points over its range), against the 50-digit
mpmath oracle as :math:`|\Delta \log r| / \max(1, |\log r|)` (for ratio outputs where the ratio is a normal
float; an underflowed or overflowed one must be the rounded exact value: :func:`rel_ratio_error`), and compared
with each method's contract.  The float32 published solver is evaluated on the points rounded to float32 (they
are float32 numbers), in float32.  A non-finite error is ``None``.  **Peak memory** is measured in a fresh
subprocess per (method, size) (:mod:`benchmarks.memory`).  Tests never assert a time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from bandcore._contract import check_positive_int
from bandcore._progress import progress as progress_bar
from bandcore.tables import rel_log_error

from .cost import is_catalogue, nearest_in_cost, solver_of, transcendental_count
from .first_call import measure_first_call
from .header import header, load_average
from .inputs import DISTRIBUTIONS, accuracy_points, llm_like_log_probs, log_probs
from .memory import measure_memory
from .methods import BASELINE, Method, method_count, methods_for
from .threads import get_threads, resolve_threads, set_threads
from .timing import Timed, interleaved, summarise

__all__ = ["THREAD_KEYS", "derive_ratios", "llm_like_log_probs", "rel_log_error", "run_bench"]

DEFAULT_DIVERGENCES = ("kl", "tv", "pearson", "hellinger", "js")
#: 500k, not 1M: a run's time is mostly the published solver's, about linear in the tokens
DEFAULT_SIZES = (500_000, 10_000)
DEFAULT_ROUNDS = 5
#: Each batch of a round runs back-to-back calls for at least this long (the timer's resolution is ~100 ns).
MIN_ROUND_SECONDS = 0.02
_MEMORY_METHODS = ("numba", "torch", "table")
#: the two thread settings of every row: one thread, and the run's threads
THREAD_KEYS = ("1", "all")
EXP_PASS = "exp_pass"


def run_bench(
    sizes: int | Sequence[int] = DEFAULT_SIZES,
    *,
    divergences: Sequence[str] = DEFAULT_DIVERGENCES,
    distributions: Sequence[str] = tuple(DISTRIBUTIONS),
    delta: float = 0.05,
    rounds: int = DEFAULT_ROUNDS,
    min_round_seconds: float = MIN_ROUND_SECONDS,
    oracle_points: int = 64,
    memory_sizes: Sequence[int] = (1_000_000, 10_000_000),
    first_calls: bool = True,
    seed: int = 0,
    threads: int | None = None,
    progress: bool | None = None,
    command: str | None = None,
    timer: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Run the benchmark and return everything as a JSON-serialisable dict (see the module docstring).

    ``sizes``: token counts timed.  ``first_calls``: measure ``band()``'s first call in a fresh subprocess per
    divergence and size (:mod:`benchmarks.first_call`).  ``threads``: the "all threads" count (default: the
    machine's cores);
    torch's and Numba's settings are restored afterwards.  ``timer``: the clock of the timed rounds.
    ``progress``: a bar on stderr (``None``: when stderr is a terminal).  ``command``: how the run was
    started, recorded in the report and its Markdown (default: this call).
    """
    sizes = tuple(dict.fromkeys(int(n) for n in ((sizes,) if isinstance(sizes, int) else sizes)))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be positive token counts, got {sizes!r}")
    distributions = tuple(dict.fromkeys(distributions))
    for name in distributions:
        log_probs(name, 1, seed)  # an unknown name fails here, before the run
    if not distributions or not divergences:
        raise ValueError("distributions and divergences must each name at least one")
    for divergence in divergences:
        transcendental_count(divergence)  # an unknown divergence or a bad formula fails here, before the run
    rounds = check_positive_int(rounds, "rounds")
    if not (isinstance(min_round_seconds, (int, float)) and 0 < min_round_seconds < math.inf):
        raise ValueError(f"min_round_seconds must be a positive number of seconds, got {min_round_seconds!r}")
    threads = resolve_threads(threads)
    if command is None:
        command = (
            f"benchmarks.bench.run_bench(sizes={sizes}, divergences={tuple(divergences)}, "
            f"distributions={distributions}, delta={delta}, rounds={rounds}, min_round_seconds={min_round_seconds}, "
            f"oracle_points={oracle_points}, memory_sizes={tuple(memory_sizes)}, first_calls={first_calls}, "
            f"seed={seed}, threads={threads})"
        )
    steps = 1 + sum(1 + method_count(d) * len(sizes) * len(distributions) for d in divergences)
    steps += len(divergences) * len(sizes) if first_calls else 0
    steps += len(memory_sizes) * len(_MEMORY_METHODS)
    saved = get_threads()
    started = (time.perf_counter(), time.process_time())
    try:
        with progress_bar(total=steps, desc="bench", unit="step", enabled=progress) as bar:
            settings = dict(
                sizes=sizes, divergences=tuple(divergences), distributions=distributions, delta=delta,
                rounds=rounds, min_round_seconds=min_round_seconds, oracle_points=oracle_points, seed=seed,
                threads=threads, command=command,
            )  # fmt: skip
            bar.set_postfix_str("copy roofline")
            report = header(settings, {d: DISTRIBUTIONS[d][1] for d in distributions})
            report["baseline_dtype"] = BASELINE[1]  # the published solver's row every speedup is over
            if first_calls:
                report["timing"] += "; a user's first call of band() is measured apart, in a fresh process"
            bar.update(1)
            inputs = {(d, n): log_probs(d, n, seed) for d in distributions for n in sizes}
            share = max(2, oracle_points // len(distributions))
            points = np.unique(np.concatenate(
                [accuracy_points(inputs[d, max(sizes)], share, seed) for d in distributions]))  # fmt: skip
            report["accuracy_points"] = len(points)
            report["first_calls"] = []
            for divergence in divergences:
                if first_calls:  # before anything of the divergence runs here; small calls first
                    for n in sorted(sizes):
                        bar.set_postfix_str(f"{divergence}: band()'s first call at {n:,}, fresh process")
                        report["first_calls"].append(
                            measure_first_call(divergence, delta, distributions[0], n, seed))  # fmt: skip
                        bar.update(1)
                _bench_divergence(report, divergence, inputs, points, timer, bar)
            derive_ratios(report)
            report["memory"] = []
            for size in memory_sizes:
                for method in _MEMORY_METHODS:
                    bar.set_postfix_str(f"memory: {method} at {size:,}")
                    report["memory"].append(measure_memory(method, "kl", delta, size, threads))
                    bar.update(1)
            report["machine"]["load_average_end"] = load_average()
            report["machine"]["run_seconds"] = time.perf_counter() - started[0]  # the whole run, wall clock
            report["machine"]["run_cpu_seconds"] = time.process_time() - started[1]  # this process, every thread
    finally:
        set_threads(*saved)
    return report


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def _error(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


#: exp(y) rounds to a subnormal or 0 below this y, and overflows above the other one.
_LOG_MIN_NORMAL, _LOG_MAX = math.log(np.finfo(np.float64).tiny), math.log(np.finfo(np.float64).max)


def rel_ratio_error(approx: np.ndarray, exact_log: np.ndarray) -> np.ndarray:
    """The contract's measure for ratio bounds: :func:`rel_log_error` of log r, except that where the exact ratio
    underflows (to a subnormal or 0) or overflows, ``approx`` equal to it (up to one subnormal step: the
    oracle's log is rounded) has error 0."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        normal = (exact_log >= _LOG_MIN_NORMAL) & (exact_log <= _LOG_MAX)
        err = rel_log_error(np.log(approx), exact_log)
        expected = np.exp(exact_log)
        rounded = (approx == expected) | (np.abs(approx - expected) <= 2.0 * np.finfo(np.float64).smallest_subnormal)
    return np.where(~normal & rounded, 0.0, err)


def _accuracy(method: Method, points: np.ndarray, exact: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    approx_lo, approx_up = method.values(points)
    measure = rel_ratio_error if method.ratios else rel_log_error
    err_lo = _error(measure(approx_lo, exact[0]).max())
    err_up = _error(measure(approx_up, exact[1]).max())
    worst = None if err_lo is None or err_up is None else max(err_lo, err_up)
    within = None if method.contract is None else worst is not None and worst <= method.contract
    return {
        "max_rel_err_lower": err_lo,
        "max_rel_err_upper": err_up,
        "max_rel_err": worst,
        "contract": method.contract,
        "within_contract": within,
    }


_NO_ACCURACY = dict.fromkeys(("max_rel_err_lower", "max_rel_err_upper", "max_rel_err", "contract", "within_contract"))


def _bench_divergence(
    report: dict[str, Any], divergence: str, inputs: dict, points: np.ndarray, timer: Callable[[], float], bar: Any
) -> None:
    """Accuracy of every method of ``divergence``, then one interleaved block per (distribution, size)."""
    from bandcore.oracle import reference_band_log

    bar.set_postfix_str(f"{divergence}: oracle, tables")
    exact = reference_band_log(divergence, points, report["delta"])
    methods, table_info, unavailable = methods_for(divergence, report["delta"])
    report["unavailable"].update(unavailable)
    if table_info is not None:
        report["tables"][divergence] = table_info
    blocks = len(inputs)
    bar.update(1 + (method_count(divergence) - len(methods)) * blocks)
    accuracy = {}
    for method in list(methods):
        try:  # a method that fails (a backend missing or broken here) is reported, and the run goes on
            accuracy[method.name] = _accuracy(method, points, exact)
        except Exception as err:
            report["unavailable"][f"{divergence}:{method.name}"] = _one_line(err)
            methods.remove(method)
            bar.update(blocks)
    cost = transcendental_count(divergence)
    for (distribution, n), x in inputs.items():
        bar.set_postfix_str(f"{divergence}: {distribution}, {n:,} tokens")
        rows, order = _block(report, divergence, methods, x, timer)
        report["blocks"].append({"distribution": distribution, "divergence": divergence, "n_tokens": n,
                                 "order": order})  # fmt: skip
        for row in rows:
            row.update(distribution=distribution, divergence=divergence, n_tokens=n, transcendentals=cost)
            row.update(accuracy.get(row["method"], _NO_ACCURACY))
        report["results"].extend(rows)
        bar.update(len(methods))


def _block(
    report: dict[str, Any], divergence: str, methods: list[Method], x: np.ndarray, timer: Callable[[], float]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Time ``methods`` on 1 and on all threads and the exp pass, interleaved; one row per method (and the exp
    pass's), and the order of the entries in every round: the 1-thread entries, the exp pass, then the same
    methods on all threads."""
    import torch

    counts = tuple(dict.fromkeys((1, report["threads"])))
    entries: dict[int, list[Timed]] = {t: [] for t in counts}  # per thread count, in the methods' order
    first: dict[str, float] = {}
    working = []
    for method in methods:
        arg = x.astype(method.dtype, copy=False)  # the float32 input itself, or its float64 copy
        fn = partial(method.timed, torch.from_numpy(arg) if method.torch_input else arg)
        used = counts if method.threaded else (1,)
        try:
            for t in used:
                set_threads(t)
                start = timer()
                fn()
                first[f"{method.name}@{t}"] = timer() - start
        except Exception as err:
            report["unavailable"][f"{divergence}:{method.name}"] = _one_line(err)
            continue
        working.append((method, arg))
        for t in used:
            entries[t].append((f"{method.name}@{t}", fn, partial(set_threads, t)))
    x64 = x.astype(np.float64)
    out = np.empty_like(x64)
    exp_pass = partial(np.exp, x64, out=out)
    start = timer()
    exp_pass()
    first[f"{EXP_PASS}@1"] = timer() - start
    entries[1].append((f"{EXP_PASS}@1", exp_pass, partial(set_threads, 1)))
    # what a method that picks its backend runs in the timed rounds (after every first call of the block)
    picked = {method.name: method.picks(arg) for method, arg in working if method.picks is not None}
    order = [entry for t in counts for entry in entries[t]]
    timed = interleaved(order, report["rounds"], report["min_round_seconds"], timer)

    def times(name: str, t: int) -> dict[str, Any]:
        key = f"{name}@{t}"
        stats = timed[key]
        return {"threads": t, **summarise(stats["rounds"]), "rounds": stats["rounds"],
                "calls_per_round": stats["calls_per_round"], "first_call_seconds": first[key]}  # fmt: skip

    rows = []
    for method, _ in working:
        one = times(method.name, 1)
        every = times(method.name, report["threads"]) if method.threaded else one
        row = {"method": method.name, "kind": method.kind, "input_dtype": method.dtype,
               "times": {"1": one, "all": every}}  # fmt: skip
        if method.name in picked:
            row["picked_backend"] = picked[method.name]
        rows.append(row)
    unit = times(EXP_PASS, 1)
    rows.append({"method": EXP_PASS, "kind": "unit", "input_dtype": "float64", "times": {"1": unit, "all": unit}})
    return rows, [key for key, _, _ in order]


def derive_ratios(report: dict[str, Any]) -> None:
    """Every row's ``ns_per_token``, ``x_exp_pass``, ``speedup_vs_published``, ``speedup_vs_published_kl`` (over
    the published solver's row ``published``: float32 in this version's runs, float64 in reports saved before),
    ``roofline_fraction`` (on all threads) and, for user generators, ``nearest_catalogue``: all computed from
    the medians in the report (so a report whose times are edited can be re-derived)."""
    median = {(r["distribution"], r["divergence"], r["method"], r["n_tokens"], k): r["times"][k]["median"]
              for r in report["results"] for k in THREAD_KEYS}  # fmt: skip
    roofline = report["copy"]["roofline_mtok_s"] * 1e6
    for row in report["results"]:
        d, v, n = row["distribution"], row["divergence"], row["n_tokens"]
        mine = {k: median[d, v, row["method"], n, k] for k in THREAD_KEYS}
        exp_pass = median.get((d, v, EXP_PASS, n, "1"))
        row["ns_per_token"] = {k: 1e9 * mine[k] / n for k in THREAD_KEYS}
        row["x_exp_pass"] = {k: None if exp_pass is None else mine[k] / exp_pass for k in THREAD_KEYS}
        for field, baseline in (("speedup_vs_published", v), ("speedup_vs_published_kl", "kl")):
            published = {k: median.get((d, baseline, BASELINE[0], n, k)) for k in THREAD_KEYS}
            row[field] = {k: None if published[k] is None else published[k] / mine[k] for k in THREAD_KEYS}
        row["roofline_fraction"] = n / mine["all"] / roofline
        row.pop("nearest_catalogue", None)
    catalogue = {v: is_catalogue(v) for v in report["divergences"]}
    solver = {v: solver_of(v) for v in report["divergences"]}
    for row in report["results"]:
        if catalogue.get(row["divergence"], True) or row["kind"] == "unit":
            continue
        row["nearest_catalogue"] = {}
        for k in THREAD_KEYS:
            same = {r["divergence"]: (r["transcendentals"], r["times"][k]["median"]) for r in report["results"]
                    if catalogue.get(r["divergence"]) and (r["distribution"], r["method"], r["n_tokens"])
                    == (row["distribution"], row["method"], row["n_tokens"])}  # fmt: skip
            if row["kind"] == "exact":  # an exact row beside the catalogue rows run by the same solver, if any
                alike = {v: c for v, c in same.items() if solver[v] == solver[row["divergence"]]}
                same = alike or same
            name = nearest_in_cost(row["transcendentals"], same)
            row["nearest_catalogue"][k] = None if name is None else {
                "divergence": name, "transcendentals": same[name][0],
                "ratio": row["times"][k]["median"] / same[name][1]}  # fmt: skip

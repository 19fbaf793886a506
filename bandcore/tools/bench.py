r"""``bandcore bench``: our Band solvers side by side with the published solver and the memory roofline.

One process, one run.  On float32 log-probabilities drawn like LLM tokens (:func:`llm_like_log_probs`), at each
size in ``sizes`` (default 1M tokens, and 10k where per-call overhead dominates), it times every
:class:`~bandcore.tools.bench_methods.Method` of each divergence: the published BandPO solver (bisection, 50
iterations, host-side checks), the exact solver on the ``numpy``, ``numba`` and ``torch`` backends, and the
certified lookup table.  Each time is the best per-call time of ``repeats`` repeats, the first call (imports,
Numba compilation or cache load) excluded and reported (:func:`~bandcore.tools.bench_timing.time_call`).

**Roofline.**  A Band evaluation reads the input and writes two outputs, so at the out-of-cache copy bandwidth
:math:`B` (:func:`~bandcore.tools.bench_timing.copy_roofline`: arrays >= 4x the last-level cache) it can reach
at most :math:`B / (3 \cdot \mathrm{itemsize})` tokens per second.  Every row has ``roofline_fraction`` (its
rate over that bound), ``speedup_vs_published`` and ``speedup_vs_best_exact`` (time ratios at the same size),
computed from the times in the report; a ``roofline`` row per divergence and size gives the bound as a time.

**Threads.**  Numba, torch (the published solver, the torch backend), the table kernels and the torch and Numba
copies all run on the same number of threads, the machine's cores unless ``threads`` is given; the NumPy backend
and NumPy's copy are single-threaded.  Each row states its thread count.  ``published_single_thread`` adds the
published solver on one thread as an extra row, ``published-1t``.

**Accuracy** is measured on a subsample (quantiles of the largest input plus log-uniform points over its range)
against the 50-digit mpmath oracle, with float64 inputs so the solver's error is not hidden by float32
rounding, as :math:`|\Delta \log r| / \max(1, |\log r|)` (the numerical contract's measure), and compared with
each method's contract (``contract``, ``within_contract``).  A non-finite error (a NaN or infinitely wrong
bound) is ``None``.

**Peak memory** is measured in a fresh subprocess per (method, size) (:mod:`bandcore.tools.bench_memory`).
Tests never assert a time; they run ``--quick``.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._progress import progress as progress_bar
from ..kernels.backends import SERIAL_MAX
from ..tables import rel_log_error
from .bench_memory import _get_threads, _measure_memory, _resolve_threads, _set_threads
from .bench_methods import Method, method_count, methods_for
from .bench_report import format_markdown, format_report
from .bench_timing import copy_roofline, time_call

__all__ = ["format_markdown", "format_report", "llm_like_log_probs", "rel_log_error", "run_bench"]

DEFAULT_DIVERGENCES = ("kl", "tv", "pearson", "hellinger", "js")
DEFAULT_SIZES = (1_000_000, 10_000)
_MEMORY_METHODS = ("numba", "torch", "table")
#: How :func:`llm_like_log_probs` draws the inputs, in one line for the report.
GENERATOR = (
    "log-uniform mixture like sampled LLM tokens: 75 % with 1 - p in [1e-7, 0.1], 20 % with p in [1e-3, 0.9], "
    "5 % with p in [1e-10, 1e-3]"
)
#: Each timed repeat runs back-to-back calls for at least this long.
MIN_REPEAT_SECONDS = 0.02


# --------------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------------


def llm_like_log_probs(n: int, seed: int = 0) -> np.ndarray:
    r"""``n`` float32 log-probabilities distributed like sampled LLM tokens (deterministic in ``seed``).

    A three-part mixture, each part log-uniform:

    * 75 % confident tokens: :math:`1 - p \in [10^{-7}, 10^{-1}]` (so :math:`p > 0.9`),
      :math:`\log p = \mathrm{log1p}(-(1-p))`;
    * 20 % middle: :math:`p \in [10^{-3}, 0.9]`;
    * 5 % heavy tail: :math:`p \in [10^{-10}, 10^{-3}]`.

    Drawn with ``numpy.random.default_rng(seed)``, computed in float64 and rounded once to float32.
    """
    rng = np.random.default_rng(seed)
    part = rng.choice(3, size=n, p=[0.75, 0.20, 0.05])
    u = rng.random(n)
    log10_bounds = np.array([[-7.0, -1.0], [-3.0, np.log10(0.9)], [-10.0, -3.0]])
    lo, hi = log10_bounds[part, 0], log10_bounds[part, 1]
    value = 10.0 ** (lo + (hi - lo) * u)
    log_p = np.where(part == 0, np.log1p(-value), np.log(value))
    return np.minimum(log_p, 0.0).astype(np.float32)


def _accuracy_points(x: np.ndarray, m: int, seed: int) -> np.ndarray:
    """``m`` float64 points: quantiles of ``x`` and log-uniform p over its range (float32-representable)."""
    rng = np.random.default_rng(seed + 1)
    quantiles = np.quantile(x.astype(np.float64), np.linspace(0.0, 1.0, m - m // 2))
    log10_p = np.log10(np.exp(np.array([x.min(), min(x.max(), -1e-7)], dtype=np.float64)))
    spread = np.log(10.0 ** rng.uniform(log10_p[0], log10_p[1], m // 2))
    return np.sort(np.concatenate([quantiles, spread]).astype(np.float32).astype(np.float64))




# --------------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------------


def run_bench(
    sizes: int | Sequence[int] = DEFAULT_SIZES,
    *,
    divergences: Sequence[str] = DEFAULT_DIVERGENCES,
    delta: float = 0.05,
    repeats: int = 5,
    oracle_points: int = 256,
    memory_sizes: Sequence[int] = (1_000_000, 10_000_000),
    seed: int = 0,
    threads: int | None = None,
    published_single_thread: bool = False,
    progress: bool | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Run the benchmark and return everything as a JSON-serialisable dict (see the module docstring).

    ``sizes``: token counts timed (default 1M and 10k).  ``threads``: the thread count of Numba and torch
    (default: the machine's cores), restored afterwards.  ``progress``: a bar on stderr; ``None`` draws it when
    stderr is a terminal, ``False`` never.  ``command``: how the run was started, recorded in the report and
    its Markdown (default: this call).
    """
    sizes = tuple(dict.fromkeys(int(n) for n in ((sizes,) if isinstance(sizes, int) else sizes)))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be positive token counts, got {sizes!r}")
    threads = _resolve_threads(threads)
    if command is None:
        command = (
            f"bandcore.tools.bench.run_bench(sizes={sizes}, divergences={tuple(divergences)}, delta={delta}, "
            f"repeats={repeats}, oracle_points={oracle_points}, memory_sizes={tuple(memory_sizes)}, seed={seed}, "
            f"threads={threads}, published_single_thread={published_single_thread})"
        )
    steps = sum(1 + method_count(d, published_single_thread) * len(sizes) for d in divergences)
    steps += 1 + len(memory_sizes) * len(_MEMORY_METHODS)
    saved = _get_threads()
    try:
        _set_threads(threads)
        with progress_bar(total=steps, desc="bench", unit="step", enabled=progress) as bar:
            settings = dict(
                sizes=sizes, divergences=tuple(divergences), delta=delta, repeats=repeats, seed=seed,
                threads=threads, published_single_thread=published_single_thread, command=command,
            )  # fmt: skip
            report, inputs, points = _setup(settings, oracle_points, bar)
            for divergence in divergences:
                _bench_divergence(report, divergence, inputs, points, bar)
            report["memory"] = []
            for size in memory_sizes:
                for method in _MEMORY_METHODS:
                    bar.set_postfix_str(f"memory: {method} at {size:,}")
                    report["memory"].append(_measure_memory(method, "kl", delta, size, threads))
                    bar.update(1)
            report["machine"]["load_average_end"] = _load_average()
    finally:
        _set_threads(*saved)
    return report


def _setup(settings: dict[str, Any], oracle_points: int, bar: Any) -> tuple[dict[str, Any], dict, np.ndarray]:
    """The report's header and the copy roofline; the inputs (size -> float32 array) and accuracy points."""
    import torch

    from .. import __version__

    torch_threads, numba_threads = _get_threads()
    bar.set_postfix_str("copy roofline")
    copy = copy_roofline(settings["threads"], settings["repeats"])
    bar.update(1)
    inputs = {n: llm_like_log_probs(n, settings["seed"]) for n in settings["sizes"]}
    points = _accuracy_points(inputs[max(inputs)], oracle_points, settings["seed"])
    numba_version = None
    if numba_threads is not None:
        import numba

        numba_version = numba.__version__
    report: dict[str, Any] = {
        "bandcore_version": __version__,
        "command": settings.pop("command"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "torch": torch.__version__,
            "numba": numba_version,
            "numpy": np.__version__,
            "torch_threads": torch_threads,
            "numba_threads": numba_threads,
            "gpu": "not used (CPU run)",
            "load_average_start": _load_average(),  # 1, 5, 15 min: other work on the machine while it ran
        },
        **settings,
        "dtype": "float32",
        "thread_note": _thread_note(settings["threads"], settings["sizes"]),
        "numba_serial_max": SERIAL_MAX,
        "timing": (
            f"best per-call time of {settings['repeats']} repeats, each of back-to-back calls lasting "
            f">= {MIN_REPEAT_SECONDS * 1e3:g} ms; the first call is excluded (first_call_seconds)"
        ),
        "generator": GENERATOR,
        "accuracy_points": len(points),
        "accuracy_measure": "max |Δ log r| / max(1, |log r|) vs the mpmath oracle (50 digits), float64 inputs",
        "copy": copy,
        "results": [],
        "tables": {},
        "unavailable": {},
    }
    return report, inputs, points

#: torch's grain: element-wise work on at most this many elements runs on one thread
TORCH_GRAIN = 32_768


def _thread_note(threads: int, sizes: tuple[int, ...]) -> str:
    note = (
        f"Numba, torch (published solver, torch backend), the table kernels and the torch/Numba copies are set to "
        f"{threads} thread(s); the NumPy backend and NumPy's copy are single-threaded"
    )
    small = []
    if threads > 1 and min(sizes) <= SERIAL_MAX:
        small.append(f"at {SERIAL_MAX:,} tokens or fewer bandcore's Numba drivers run serially")
    if threads > 1 and min(sizes) <= TORCH_GRAIN:
        small.append(f"torch splits element-wise work into chunks of {TORCH_GRAIN:,} elements")
    if small:
        text = " and ".join(small)
        note += f". {text[0].upper()}{text[1:]}, so those calls use one thread whatever the setting"
    return note


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # not on this platform
        return None


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


def _error(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _accuracy(method: Method, points: np.ndarray, exact: tuple[np.ndarray, np.ndarray]) -> dict[str, Any]:
    approx_lo, approx_up = method.logs(points)
    err_lo = _error(rel_log_error(approx_lo, exact[0]).max())
    err_up = _error(rel_log_error(approx_up, exact[1]).max())
    worst = None if err_lo is None or err_up is None else max(err_lo, err_up)
    within = None if method.contract is None else worst is not None and worst <= method.contract
    return {
        "max_rel_err_lower": err_lo,
        "max_rel_err_upper": err_up,
        "max_rel_err": worst,
        "contract": method.contract,
        "within_contract": within,
    }


def _time_method(method: Method, arg: Any, repeats: int) -> dict[str, Any]:
    if method.torch_threads is None:
        return time_call(lambda: method.timed(arg), repeats, MIN_REPEAT_SECONDS)
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(method.torch_threads)
    try:
        return time_call(lambda: method.timed(arg), repeats, MIN_REPEAT_SECONDS)
    finally:
        torch.set_num_threads(saved)


def _bench_divergence(
    report: dict[str, Any], divergence: str, inputs: dict[int, np.ndarray], points: np.ndarray, bar: Any
) -> None:
    """Time every method of ``divergence`` at every size and measure its accuracy; rows go to ``report``."""
    import torch

    from ..oracle import reference_band_log

    delta = report["delta"]
    bar.set_postfix_str(f"{divergence}: oracle, tables")
    exact = reference_band_log(divergence, points, delta)
    methods, table_info, unavailable = methods_for(
        divergence, delta, report["threads"], published_single_thread=report["published_single_thread"]
    )
    report["unavailable"].update(unavailable)
    if table_info is not None:
        report["tables"][divergence] = table_info
    bar.update(1 + (method_count(divergence, report["published_single_thread"]) - len(methods)) * len(inputs))
    for method in methods:
        bar.set_postfix_str(f"{divergence}: {method.name}")
        rows = []
        try:  # a method that fails (a backend missing or broken here) is reported, and the run goes on
            accuracy = _accuracy(method, points, exact)
            for n, x in inputs.items():
                timing = _time_method(method, torch.from_numpy(x) if method.torch_input else x, report["repeats"])
                row = {"n_tokens": n, "divergence": divergence, "method": method.name, "kind": method.kind}
                rows.append({**row, "threads": method.threads, **timing, **accuracy})
                bar.update(1)
        except Exception as err:
            report["unavailable"][f"{divergence}:{method.name}"] = _one_line(err)
            bar.update(len(inputs) - len(rows))
            continue
        report["results"].extend(rows)
    for n in inputs:
        _add_ratios(report, divergence, n)


def _add_ratios(report: dict[str, Any], divergence: str, n: int) -> None:
    """The roofline row and every row's ratios at (divergence, n), from the times in the report."""
    rows = [r for r in report["results"] if r["divergence"] == divergence and r["n_tokens"] == n]
    roofline = report["copy"]["roofline_mtok_s"]
    rows.append(
        {
            "n_tokens": n, "divergence": divergence, "method": "roofline", "kind": "roofline",
            "threads": report["threads"], "seconds": n / (roofline * 1e6), "first_call_seconds": None,
            "calls_per_repeat": None, "max_rel_err_lower": None, "max_rel_err_upper": None, "max_rel_err": None,
            "contract": None, "within_contract": None,
        }
    )  # fmt: skip
    report["results"].append(rows[-1])
    published = next((r["seconds"] for r in rows if r["method"] == "published"), None)
    exact = [r["seconds"] for r in rows if r["kind"] == "exact"]
    best_exact = min(exact) if exact else None
    for row in rows:
        row["mtok_s"] = n / row["seconds"] / 1e6
        row["roofline_fraction"] = row["mtok_s"] / roofline
        row["speedup_vs_published"] = None if published is None else published / row["seconds"]
        row["speedup_vs_best_exact"] = None if best_exact is None else best_exact / row["seconds"]

"""``bandcore bench``: time the backends and tables against the published solver, interleaved, on 1 and all threads.

The benchmark itself is :mod:`benchmarks.bench`; this module parses the options, prints the text report and
writes the JSON (``--json``) and the Markdown generated from it (``--markdown``, with this command line).
Every method and the published solver (the baseline: on float32 log-probs, computing in float32 as trainers run
it; beside it on float64) are timed on 1 thread and on the machine's cores (``--threads N``), torch and Numba set
to the same count, in interleaved rounds with one ``np.exp`` pass (the machine-independent unit), on the token
distributions ``llm``, ``mid`` and ``flat``; ``band()`` with its default backend beside each forced one.  A
progress bar is drawn on stderr when it is a terminal (never with ``--quiet``).
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from .inputs import DISTRIBUTIONS

__all__ = ["register"]

_DEFAULT_DIVERGENCES = ("kl", "tv", "pearson", "hellinger", "js")
_DEFAULT_SIZES = (500_000, 10_000)
_DISTRIBUTIONS = tuple(DISTRIBUTIONS)
_QUICK = dict(sizes=(20_000, 1_000), rounds=3, min_round_seconds=0.005, oracle_points=16, memory_sizes=())


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` parser and its handler."""
    p = subparsers.add_parser(
        "bench",
        help="time the backends and tables against the published solver on float32 (interleaved, 1 and all threads)",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    p.add_argument(
        "--n", type=int, nargs="+", metavar="N", help="token counts to time (default: 500000 10000, i.e. 500k and 10k)"
    )
    p.add_argument("--delta", type=float, default=0.05, help="trust-region radius (default 0.05)")
    p.add_argument("--divergences", nargs="+", help=f"divergences to time (default {' '.join(_DEFAULT_DIVERGENCES)})")
    p.add_argument(
        "--distributions", nargs="+", choices=_DISTRIBUTIONS, metavar="NAME",
        help="token distributions, each a block of the report: "
             + "; ".join(f"{name} ({text})" for name, (_, text) in DISTRIBUTIONS.items()).replace("%", "%%")
             + " (default: all)",
    )  # fmt: skip
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds, the median is kept (default 5)")
    p.add_argument("--oracle-points", type=int, default=64, help="points checked against mpmath, shared among the "
                   "distributions (default 64)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the input generator (default 0)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--no-first-call", action="store_true",
                   help="skip the subprocesses that time band()'s first call in a fresh process")  # fmt: skip
    p.add_argument(
        "--threads", type=int, help="the 'all threads' count of Numba and torch (default: the machine's cores)"
    )
    p.add_argument(
        "--quick", action="store_true",
        help="small run (20k and 1k tokens, 3 rounds of 5 ms, 16 oracle points, kl tv pearson, no memory "
             "subprocesses) for a first look",
    )  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--markdown", metavar="FILE", help="write the Markdown tables (generated from the JSON report)")
    p.add_argument(
        "--from-json", metavar="FILE", nargs="+",
        help="run nothing: print (and --markdown) the report saved in FILE; with several files, the spread over "
             "those runs (median [min - max] of every time and ratio)",
    )  # fmt: skip
    p.set_defaults(handler=_handle)


def _positive(value: int, option: str) -> int:
    if value < 1:
        raise ValueError(f"{option} must be a positive integer, got {value}")
    return value


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    from bandcore._contract import check_delta

    settings: dict[str, Any] = dict(delta=check_delta(args.delta, "--delta"), seed=args.seed)
    if args.threads is not None:
        settings["threads"] = _positive(args.threads, "--threads")
    if args.quick:
        settings.update(_QUICK, divergences=tuple(args.divergences or ("kl", "tv", "pearson")))
        if args.n:
            settings["sizes"] = tuple(_positive(n, "--n") for n in args.n)
    else:
        settings.update(
            sizes=tuple(_positive(n, "--n") for n in args.n) if args.n else _DEFAULT_SIZES,
            rounds=_positive(args.rounds, "--rounds"),
            oracle_points=_positive(args.oracle_points, "--oracle-points"),
            memory_sizes=() if args.no_memory else (1_000_000, 10_000_000),
            divergences=tuple(args.divergences or _DEFAULT_DIVERGENCES),
        )
    settings["distributions"] = tuple(args.distributions or _DISTRIBUTIONS)
    settings["first_calls"] = not args.no_first_call
    return settings


def _check_folder(path: str | None, option: str) -> None:
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise FileNotFoundError(f"{option}: directory {Path(path).resolve().parent} does not exist")


def _handle(args: argparse.Namespace) -> int:
    from .bench import derive_ratios
    from .report import check_format, format_markdown, format_report
    from .spread import check_comparable, format_spread

    for path, option in ((args.json, "--json"), (args.markdown, "--markdown")):
        _check_folder(path, option)  # fail before the run, not after it
    if args.from_json and len(args.from_json) > 1:
        if args.json:
            raise ValueError("--json: not with several --from-json files (they are the runs of the spread)")
        reports = [json.loads(Path(name).read_text(encoding="utf-8")) for name in args.from_json]
        for report, name in zip(reports, args.from_json, strict=True):
            check_format(report, name)
            derive_ratios(report)  # every derived column from the saved medians, by this version's rules
        check_comparable(reports, args.from_json)
        markdown = format_spread(reports)
        print(markdown, end="")
        if args.markdown:
            Path(args.markdown).write_text(markdown, encoding="utf-8")
        return 0
    if args.from_json:
        text = Path(args.from_json[0]).read_text(encoding="utf-8")
    else:
        from .bench import run_bench

        settings = _settings(args)
        command = shlex.join(["bandcore", *getattr(args, "argv", ["bench"])])
        report = run_bench(progress=False if args.quiet else None, command=command, **settings)
        text = json.dumps(report, indent=2, allow_nan=False) + "\n"
        if args.json:
            Path(args.json).write_text(text, encoding="utf-8")
    report = json.loads(text)  # the text and the Markdown are rendered from the JSON, as saved
    check_format(report, args.from_json[0] if args.from_json else "the run")
    derive_ratios(report)
    print(format_report(report))
    if args.markdown:
        Path(args.markdown).write_text(format_markdown(report), encoding="utf-8")
    return 0

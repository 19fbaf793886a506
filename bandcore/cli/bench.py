"""``bandcore bench``: time the backends and tables against the published solver and a memory copy.

The benchmark itself is :mod:`bandcore.tools.bench`; this module parses the options and prints its report.
torch and Numba run with the same thread count (the machine's cores unless ``--threads N``).  A progress
bar is drawn on stderr when it is a terminal (never with ``--quiet``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["register"]

_DEFAULT_DIVERGENCES = ("kl", "tv", "pearson", "hellinger", "js")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` parser and its handler."""
    p = subparsers.add_parser(
        "bench",
        help="time the backends and tables against the published solver and a copy",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    p.add_argument("--n", type=int, default=1_000_000, help="number of float32 log-probs (default 1M)")
    p.add_argument("--delta", type=float, default=0.05, help="trust-region radius (default 0.05)")
    p.add_argument("--divergences", nargs="+", help=f"divergences to time (default {' '.join(_DEFAULT_DIVERGENCES)})")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats, best is kept (default 5)")
    p.add_argument("--oracle-points", type=int, default=256, help="points checked against mpmath (default 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the input generator (default 0)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument(
        "--threads", type=int, help="torch and Numba threads, the same for both (default: the machine's cores)"
    )
    p.add_argument("--quick", action="store_true", help="small run (20k tokens, 16 oracle points) for tests")
    p.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.set_defaults(handler=_handle)


def _positive(value: int, option: str) -> int:
    if value < 1:
        raise ValueError(f"{option} must be a positive integer, got {value}")
    return value


def _handle(args: argparse.Namespace) -> int:
    from .._contract import check_delta
    from ..tools.bench import format_report, run_bench

    delta = check_delta(args.delta, "--delta")
    if args.threads is not None:
        _positive(args.threads, "--threads")
    if args.quick:
        kwargs = dict(n=20_000, repeats=2, oracle_points=16, memory_sizes=(200_000,))
        kwargs["divergences"] = tuple(args.divergences or ("kl", "tv", "pearson"))
    else:
        kwargs = dict(
            n=_positive(args.n, "--n"),
            repeats=_positive(args.repeats, "--repeats"),
            oracle_points=_positive(args.oracle_points, "--oracle-points"),
        )
        kwargs["memory_sizes"] = () if args.no_memory else (1_000_000, 10_000_000)
        kwargs["divergences"] = tuple(args.divergences or _DEFAULT_DIVERGENCES)
    if args.json:  # fail before the run, not after it
        parent = Path(args.json).resolve().parent
        if not parent.is_dir():
            raise FileNotFoundError(f"--json: directory {parent} does not exist")
    report = run_bench(
        delta=delta, seed=args.seed, threads=args.threads, progress=False if args.quiet else None, **kwargs
    )
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    return 0

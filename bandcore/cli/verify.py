"""``bandcore verify``: check the Band against CVXPY's global optimum over the n-category simplex.

For each divergence (any spelling of :func:`bandcore.divergences.resolve`; default: the catalogue) the
programs max/min u_a s.t. Σ_j π_old(j) u_j = 1, Σ_j π_old(j) f(u_j) <= δ, u >= 0 are solved at every n, p and
δ, and their optima compared with the Band (:func:`bandcore.verify.verify`).
Exit 1 when a divergence fails; 2 for a bad option or a generator CVXPY cannot take.  A progress bar is drawn
on stderr when it is a terminal (never with ``--quiet``).
"""

from __future__ import annotations

import argparse
import math

from .._progress import progress
from .derive import divergence_argument

__all__ = ["register"]

_DEFAULT_N = (2, 10, 100, 1000)
_DEFAULT_P = (0.001, 0.08, 0.5, 0.9)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``verify`` parser and its handler."""
    parser = subparsers.add_parser(
        "verify",
        help="check the Band against CVXPY's global optimum over the n-category simplex",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help="divergences (default: the whole catalogue)")
    parser.add_argument("--delta", type=float, nargs="+", default=[0.05], help="trust-region radius δ")
    parser.add_argument("--n", type=int, nargs="+", default=list(_DEFAULT_N), help="vocabulary sizes (>= 2)")
    parser.add_argument("--p", type=float, nargs="+", default=list(_DEFAULT_P), help="old probabilities in (0, 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the old distributions (default 0)")
    parser.add_argument("--solver", default="CLARABEL", help="primary CVXPY solver (default CLARABEL)")
    parser.add_argument("--cross-check", default="SCS", help="second solver, or 'none' (default SCS)")
    parser.add_argument("--tolerance", type=float, default=1e-6, help="largest accepted error (default 1e-6)")
    parser.add_argument("--summary", dest="table", action="store_false", help="one paragraph per divergence")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(handler=_handle)


def _check(args: argparse.Namespace) -> None:
    bad = [d for d in args.delta if not (math.isfinite(d) and d > 0)]
    if bad:
        raise ValueError(f"--delta values must be finite and > 0, got {', '.join(map(repr, bad))}")
    bad = [p for p in args.p if not (0.0 < p < 1.0)]  # NaN fails both comparisons
    if bad:
        raise ValueError(f"--p values must lie in (0, 1), got {', '.join(map(repr, bad))}")
    bad = [n for n in args.n if n < 2]
    if bad:
        raise ValueError(f"--n values must be integers >= 2, got {', '.join(map(repr, bad))}")
    if not (math.isfinite(args.tolerance) and args.tolerance > 0):
        raise ValueError(f"--tolerance must be finite and > 0, got {args.tolerance!r}")


def _handle(args: argparse.Namespace) -> int:
    from ..divergences import list_divergences
    from ..verify import verify

    _check(args)
    divergences = [divergence_argument(name) for name in (args.names or list_divergences())]
    cross_check = None if args.cross_check.lower() == "none" else args.cross_check
    total = 2 * len(args.n) * len(args.p) * len(args.delta) * len(divergences)
    reports = []
    with progress(total=total, desc="verify", unit="program", enabled=False if args.quiet else None) as bar:
        for div in divergences:
            bar.set_postfix_str(div.name)
            report = verify(
                div,
                args.delta,
                n=args.n,
                p=args.p,
                seed=args.seed,
                solver=args.solver,
                cross_check=cross_check,
                tolerance=args.tolerance,
                progress=lambda _done: bar.update(1),
            )
            reports.append(report)
            # above the bar on a terminal, plain print otherwise
            bar.write(f"## {report.divergence}\n\n{report.to_markdown() if args.table else report.summary()}\n")
    failed = [r.divergence for r in reports if not r.passed]
    verdict = f"; FAILED: {', '.join(failed)}" if failed else ""
    print(f"{len(reports) - len(failed)}/{len(reports)} divergences verified{verdict}")
    return 1 if failed else 0

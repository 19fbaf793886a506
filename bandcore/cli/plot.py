"""``bandcore plot {bounds,ratio,region}``: draw the Band (PNG or PDF, by the file's extension).

* ``bounds`` — the allowed probability change Δπ = p (r - 1) against p: PPO's clip, clip-higher and the Band;
* ``ratio`` — the ratio bounds r_lo(p), r_up(p) on log-log axes, with the simplex limit r = 1/p;
* ``region`` — where the clipped PPO surrogate is flat over (p, r), for A > 0 and A < 0.

Divergences take every spelling of :func:`bandcore.divergences.resolve` (a name, an alias, ``alpha(a)``, a
formula in u).  The figures are :mod:`bandcore.plot`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from .derive import divergence_argument

__all__ = ["register"]

_DEFAULT_DIVERGENCES = ("kl", "tv", "pearson", "hellinger", "js")
_FORMATS = (".png", ".pdf")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plot`` parser and its handler."""
    parser = subparsers.add_parser(
        "plot",
        help="draw the Band: bounds vs p, ratio bounds, clipped PPO regions",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("figure", choices=("bounds", "ratio", "region"))
    parser.add_argument("--delta", type=float, default=0.05, help="trust-region radius δ (default 0.05)")
    parser.add_argument("--eps", type=float, default=0.2, help="PPO clip ε in (0, 1) (default 0.2)")
    parser.add_argument(
        "--divergences", nargs="+", default=list(_DEFAULT_DIVERGENCES), help="bounds/ratio: the Band's divergences"
    )
    parser.add_argument("--divergence", default="kl", help="region: the Band's divergence (default kl)")
    parser.add_argument("--out", required=True, help="output file, .png or .pdf")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from .._contract import check_delta

    delta = check_delta(args.delta, "--delta")
    if not (math.isfinite(args.eps) and 0.0 < args.eps < 1.0):
        raise ValueError(f"--eps must lie in (0, 1), got --eps={args.eps!r}")
    out = Path(args.out)
    if out.suffix.lower() not in _FORMATS:
        raise ValueError(f"--out must end in one of {', '.join(_FORMATS)}, got --out={args.out!r}")
    if args.figure == "region":
        divergences = [divergence_argument(args.divergence)]
    else:
        divergences = [divergence_argument(name) for name in args.divergences]

    import matplotlib.pyplot as plt

    from ..plot import plot_bounds, plot_ratio, plot_region

    if args.figure == "bounds":
        fig = plot_bounds(delta, divergences, eps=args.eps, out=out)
    elif args.figure == "ratio":
        fig = plot_ratio(delta, divergences, eps=args.eps, out=out)
    else:
        fig = plot_region(divergences[0], delta, eps=args.eps, out=out)
    plt.close(fig)
    print(f"wrote {out}")
    return 0

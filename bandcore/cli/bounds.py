"""``bandcore bounds``: print the Band [lower, upper] of some token probabilities next to PPO's clip.

For each probability p: the Band's ratio bounds, the range of the probability change Δπ = p (r - 1) they
allow, and the same for PPO's [1 - ε, 1 + ε] (its upper end capped at 1/p: π cannot exceed 1).
``--divergence`` takes every spelling of :func:`bandcore.divergences.resolve`: a name, an alias,
``alpha(a)`` or a formula in u.
"""

from __future__ import annotations

import argparse
import math

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bounds`` parser and its handler."""
    parser = subparsers.add_parser(
        "bounds",
        help="print the Band [lower, upper] of some probabilities next to PPO's clip",
        description="Print the Band of each token probability p, its Δπ range, and PPO's [1-ε, 1+ε].",
    )
    parser.add_argument("--divergence", default="kl", help="name, alias, alpha(a) or a formula in u (default: kl)")
    parser.add_argument("--delta", type=float, default=0.05, help="trust-region radius δ (default: 0.05)")
    parser.add_argument("--p", type=float, nargs="+", default=[0.001, 0.08, 0.5, 0.99], help="probabilities in (0, 1]")
    parser.add_argument("--eps", type=float, default=0.2, help="PPO clip ε in (0, 1) for comparison (default: 0.2)")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    import numpy as np

    from .._contract import check_delta
    from ..band import band
    from ..divergences import get_transform, resolve_region

    bad = [v for v in args.p if not (0.0 < v <= 1.0)]  # NaN fails both comparisons
    if bad:
        raise ValueError(f"--p values must lie in (0, 1], got {', '.join(repr(v) for v in bad)}")
    if not (math.isfinite(args.eps) and 0.0 < args.eps < 1.0):
        raise ValueError(f"--eps must lie in (0, 1), got --eps={args.eps!r}")
    check_delta(args.delta, "--delta")
    try:
        div, delta_f = resolve_region(args.divergence, args.delta, "--delta")
    except (ValueError, TypeError) as err:
        raise type(err)(f"--divergence {args.divergence!r}: {err}") from None
    p = np.asarray(args.p, dtype=np.float64)
    lower, upper = band(np.log(p), div, delta_f)
    shown = f"{div.name} at delta = {delta_f:g}"
    transform = get_transform(args.divergence)
    if transform is not None:
        shown = f"{transform.name} at delta = {args.delta:g} ({shown})"
    print(f"Band of {shown}   (PPO clip eps = {args.eps:g})")
    print(
        f"{'p':>10} {'lower':>12} {'upper':>12} {'dpi_min':>12} {'dpi_max':>12}   "
        f"{'ppo_lower':>9} {'ppo_upper':>9} {'ppo_dpi_min':>11} {'ppo_dpi_max':>11}"
    )
    lo_ppo, up_ppo = 1 - args.eps, 1 + args.eps
    for pi, lo, up in zip(p, lower, upper, strict=True):
        ppo_up = min(up_ppo, 1 / pi)  # PPO cannot raise π above 1 either
        print(
            f"{pi:>10.4g} {lo:>12.6g} {up:>12.6g} {pi * (lo - 1):>12.6g} {pi * (up - 1):>12.6g}   "
            f"{lo_ppo:>9.4g} {ppo_up:>9.4g} {pi * (lo_ppo - 1):>11.4g} {pi * (ppo_up - 1):>11.4g}"
        )
    return 0

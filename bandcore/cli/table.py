"""``bandcore table``: build, inspect and re-certify table files; regenerate and check the shipped tables.

``build`` takes any divergence spelling (name, alias, ``alpha(a)``, formula in u).  ``regenerate`` writes the
package's data folder (``bandcore/tables/data``) or ``--dir DIR``, where it refuses to replace existing files
unless ``--force``; ``check-shipped`` exits 1 when the shipped tables are stale.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register"]


def _parse_delta(text: str):
    try:
        if "," in text:
            lo, hi = text.split(",", 1)
            return (float(lo), float(hi))
        return float(text)
    except ValueError:
        raise ValueError(f"--delta must be a number or lo,hi, got {text!r}") from None


def _build(args: argparse.Namespace) -> int:
    from ..tables import BandTable

    table = BandTable.build(args.divergence, _parse_delta(args.delta), target=args.target, progress=_bars(args))
    path = table.save(args.out)
    print(f"{table!r} -> {path} ({path.stat().st_size:,} bytes)")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from ..tables import BandTable, read_table

    table = BandTable.load(args.file)
    _, meta = read_table(args.file)
    print(repr(table))
    for key in sorted(meta):
        print(f"  {key}: {meta[key]}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from ..tables import BandTable

    table = BandTable.load(args.file)
    measured = table.recertify(args.points)
    ok = measured <= table.max_rel_error
    print(
        f"{table!r}: re-measured max error {measured:.3e} on {args.points} points per interval "
        f"({'within' if ok else 'ABOVE'} the certified {table.max_rel_error:.3e})"
    )
    return 0 if ok else 1


def _regenerate(args: argparse.Namespace) -> int:
    from ..tables.shipped import SHIPPED_DIR, regenerate

    directory = Path(args.dir) if args.dir else SHIPPED_DIR
    for entry in regenerate(directory, progress=_bars(args), overwrite=args.force):
        print(
            f"{entry['file']}: {entry['bytes']:,} bytes, {entry['knots']} knots, "
            f"max_rel_error {entry['max_rel_error']:.2e}"
        )
    return 0


def _check_shipped(args: argparse.Namespace) -> int:
    from ..tables.shipped import SHIPPED, SHIPPED_DIR, check_shipped

    problems = check_shipped(Path(args.dir) if args.dir else SHIPPED_DIR)
    for problem in problems:
        print(f"stale: {problem}")
    if not problems:
        print(f"{len(SHIPPED)} shipped tables are fresh")
    return 1 if problems else 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``bandcore table build|inspect|check|regenerate|check-shipped``."""
    p = subparsers.add_parser("table", help="build, inspect and check lookup tables with a certified error")
    sub = p.add_subparsers(dest="table_command", required=True, metavar="ACTION", parser_class=type(p))
    b = sub.add_parser("build", help="tabulate a divergence at one delta (or a range lo,hi for a 2-D table)")
    b.add_argument("--divergence", required=True, help="name, alias, alpha(a) or a formula in u, e.g. kl")
    b.add_argument("--delta", required=True, help="delta, or lo,hi for a 2-D table over delta")
    b.add_argument("--target", type=float, default=1e-7, help="certified error target (default 1e-7)")
    b.add_argument("--out", required=True, help="output file: .npz, .safetensors, .json or .csv")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(handler=_build)
    i = sub.add_parser("inspect", help="print a table file's metadata")
    i.add_argument("file")
    i.set_defaults(handler=_inspect)
    c = sub.add_parser("check", help="re-certify a table file against the exact solver")
    c.add_argument("file")
    c.add_argument("--points", type=int, default=13, help="check points per interval (default 13)")
    c.set_defaults(handler=_check)
    r = sub.add_parser("regenerate", help="rebuild the shipped tables and their manifest")
    r.add_argument("--dir", "--out", dest="dir", help="directory (default: the package's bandcore/tables/data)")
    r.add_argument("--force", action="store_true", help="replace existing table files in --dir")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.set_defaults(handler=_regenerate)
    s = sub.add_parser("check-shipped", help="fail when the shipped tables are stale")
    s.add_argument("--dir", help="directory (default: the package's bandcore/tables/data)")
    s.set_defaults(handler=_check_shipped)


def _bars(args: argparse.Namespace) -> bool:
    """Progress bars only on a terminal, never with --quiet (the decision of :mod:`bandcore._progress`)."""
    from .._progress import progress_enabled

    return progress_enabled(False if args.quiet else None)

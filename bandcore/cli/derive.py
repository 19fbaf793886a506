"""``bandcore list``, ``bandcore derive`` and ``bandcore derivations``: the catalogue, derivations and their reports.

* ``list`` prints the catalogue: names, aliases, generators and conventions.
* ``derive [DIVERGENCE]`` derives the Band of one divergence (any spelling of
  :func:`bandcore.divergences.resolve`: a name, an alias, ``alpha(a)``, a formula in u) and prints its report;
  without an argument it derives the whole catalogue and prints a summary table.
* ``derivations`` renders the reports of the catalogue.  ``--check`` compares them with the packaged copy (and
  with ``derivations/`` of a source checkout, when there is one) or with ``--out DIR``, exit 1 if any differs;
  ``--update`` rewrites those copies; otherwise the reports are written to ``--out`` (default ``derivations/``
  in the current directory), never replacing a file that differs unless ``--force``.

Each report carries a CVXPY verification line (``bandcore.verify.summary_line``, minutes for the catalogue);
``--no-verify`` leaves it out (and ``--check --no-verify`` compares everything but that line).  A progress
bar is drawn on stderr when it is a terminal (never with ``--quiet``).
"""

from __future__ import annotations

import argparse
import math
from functools import partial
from pathlib import Path
from typing import Any

from .._progress import progress

__all__ = ["divergence_argument", "register"]

_REPORT_DELTA = 0.05
_TABLE_P = (0.001, 0.08, 0.5)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``list``, ``derive`` and ``derivations`` parsers and their handlers."""
    parser = subparsers.add_parser("list", help="list the catalogue of divergences")
    parser.set_defaults(handler=_list_command)

    parser = subparsers.add_parser(
        "derive",
        help="derive the Band of a divergence (name, alias, alpha(a) or a formula in u)",
        description="Derive the Band of one divergence (a catalogue name, an alias, alpha(a), or a formula in "
        "u such as '(u-1)**2'); with no argument, derive the whole catalogue and print a summary table.",
    )
    parser.add_argument("divergence", nargs="?", help="name, alias, alpha(a) or generator formula f(u)")
    parser.add_argument("--delta", type=float, default=_REPORT_DELTA, help="δ for the numbers shown (0.05)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the Markdown report to FILE")
    parser.add_argument("--verify", action="store_true", help="with --markdown: add the CVXPY verification line")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(handler=_derive_command)

    parser = subparsers.add_parser(
        "derivations",
        help="regenerate (or --check) the derivation reports",
        description="Render the derivation reports of the catalogue; check them against the packaged copy, or "
        "write them.",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if any report differs; write nothing")
    parser.add_argument(
        "--update", action="store_true", help="rewrite the packaged reports (and derivations/ of a source checkout)"
    )
    parser.add_argument(
        "--out", "--dir", dest="out", metavar="DIR", help="folder to write (default: ./derivations) or --check"
    )
    parser.add_argument("--force", action="store_true", help="replace files in --out that differ")
    parser.add_argument("--no-verify", action="store_true", help="leave out the CVXPY verification lines")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(handler=_derivations_command)


# --------------------------------------------------------------------------------------------------------
# Shared helpers (also used by bandcore.cli.verify)
# --------------------------------------------------------------------------------------------------------


def divergence_argument(text: str) -> Any:
    """The divergence named by a command-line argument; a refused formula becomes a one-line ``ValueError``."""
    from ..divergences import GeneratorError, list_divergences, resolve

    try:
        return resolve(text)
    except GeneratorError as err:
        names = ", ".join(list_divergences())
        raise ValueError(
            f"divergence {text!r} is neither a catalogue name ({names}, alpha(a)) nor an accepted formula in u: "
            f"{err}"
        ) from None


def _enabled(args: argparse.Namespace) -> bool | None:
    """The progress bars of a command: never with ``--quiet``, else when stderr is a terminal."""
    return False if args.quiet else None


def _check_delta(delta: float) -> float:
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"--delta must be a finite number > 0, got {delta!r}")
    return delta


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
        if index == 0:
            print("  ".join("-" * width for width in widths))


# --------------------------------------------------------------------------------------------------------
# list, derive
# --------------------------------------------------------------------------------------------------------


def _list_command(args: argparse.Namespace) -> int:
    from ..divergences import list_divergences, resolve
    from ..divergences.transforms import TRANSFORMS

    rows = [("name", "aliases", "f(u)", "convention")]
    for name in list_divergences():
        div = resolve(name)
        shown = f"{name} (alpha=A, default {div.params[0][1]:g})" if div.params else name
        rows.append((shown, ", ".join(div.aliases) or "-", div.formula, div.convention))
    for name, doc in TRANSFORMS.items():  # monotone transforms: an f-divergence with a mapped radius
        shown = name if name == "bhattacharyya" else f"{name}(A)"
        rows.append((shown, "-", "(transform of alpha(A); radius mapped)", doc["convention"]))
    _print_table(rows)
    return 0


def _derive_command(args: argparse.Namespace) -> int:
    from ..derive import derive

    delta = _check_delta(args.delta)
    if args.divergence is None:
        _print_table(_summary_rows(delta, _enabled(args)))
        return 0
    from ..divergences import get_transform, resolve_region

    transform = get_transform(args.divergence)
    if transform is not None:  # derive its f-divergence, at the mapped radius
        div, delta_f = resolve_region(args.divergence, delta, "--delta")
        print(f"{transform.name}: {transform.convention}\n--delta {delta:g} is {transform.base} <= {delta_f!r}\n")
        delta = delta_f
    else:
        div = divergence_argument(args.divergence)
    if args.markdown and not Path(args.markdown).resolve().parent.is_dir():  # fail before the derivation
        raise FileNotFoundError(f"--markdown: directory {Path(args.markdown).resolve().parent} does not exist")
    d = derive(div, progress=_enabled(args))
    print(d.to_text(delta))
    if args.markdown:
        line = _verified_line(div, progress=_enabled(args)) if args.verify else None
        Path(args.markdown).write_text(d.to_markdown(verified_line=line), encoding="utf-8")
        print(f"\nwrote {args.markdown}")
    return 0


def _summary_rows(delta: float, enabled: bool | None) -> list[tuple[str, ...]]:
    import numpy as np

    from ..band import band
    from ..derive import catalogue, derive

    header = ("divergence", "closed form up/lo", f"upper=1/p iff (δ={delta:g})", "lower=0 iff", "f''(1)")
    header += tuple(f"Band at p={p:g}" for p in _TABLE_P)
    rows = [header]
    log_p = np.log(np.array(_TABLE_P))
    with progress(catalogue(), desc="derive", unit="divergence", enabled=enabled) as bar:
        for div in bar:
            bar.set_postfix_str(div.name)
            rows.append(_summary_row(derive(div, progress=False), band(log_p, div, delta), delta))
    return rows


def _summary_row(d: Any, bounds: tuple[Any, Any], delta: float) -> tuple[str, ...]:
    lower, upper = bounds
    closed = "/".join("yes" if e is not None else "no" for e in (d.upper, d.lower))
    up, lo = d.saturation_upper, d.saturation_lower
    return (
        d.divergence.name,
        closed,
        "never" if up.never else f"p ≥ {up(delta):.6g}",
        "never" if lo.never else f"p ≤ {lo(delta):.6g}",
        str(d.f2),
        *(f"[{lo_:.6g}, {up_:.6g}]" for lo_, up_ in zip(lower, upper, strict=True)),
    )


# --------------------------------------------------------------------------------------------------------
# derivations
# --------------------------------------------------------------------------------------------------------


def _verified_line(div: Any, progress: bool | None = None) -> str | None:
    """The CVXPY verification line of a report (``bandcore.verify.summary_line``)."""
    from ..verify import summary_line

    return summary_line(div, progress=progress)


def _derivations_command(args: argparse.Namespace) -> int:
    from .._contract import BandcoreError
    from ..derive.closed_forms.files import (
        check_directory,
        packaged_directory,
        packaged_reports,
        render_derivations,
        source_tree_directory,
        stale_reports,
        write_derivations,
    )

    if args.check and args.update:
        raise ValueError("--check and --update exclude each other")
    if args.update and (args.out or args.no_verify):
        raise ValueError("--update rewrites the packaged reports in full: it takes neither --out nor --no-verify")
    files = render_derivations(
        verified_line=None if args.no_verify else partial(_verified_line, progress=_enabled(args)),
        progress=_enabled(args),
    )
    ignore = args.no_verify
    if args.check:
        if args.out:
            targets = {args.out: check_directory(files, args.out, ignore_verified=ignore)}
        else:
            packaged = stale_reports(files, packaged_reports(), ignore_verified=ignore, exact=True)
            targets = {"the packaged reports": packaged}
            tree = source_tree_directory()
            if tree is not None:
                targets[str(tree)] = check_directory(files, tree, ignore_verified=ignore, exact=True)
        stale = {where: names for where, names in targets.items() if names}
        if stale:
            fix = f"--out {args.out} --force" if args.out else "--update"
            listed = "; ".join(f"in {where}: {', '.join(names)}" for where, names in stale.items())
            raise BandcoreError(f"out of date {listed}; run `bandcore derivations {fix}`")
        print(f"{' and '.join(targets)}: all {len(files)} reports up to date")
        return 0
    if args.update:
        folders = [packaged_directory(), source_tree_directory()]
        if folders[0] is None:
            raise BandcoreError("the packaged reports are not a folder on disk (installed from a zip?); use --out")
        for folder in (f for f in folders if f is not None):
            written = write_derivations(folder, files, force=True, exact=True)
            print(f"{folder}: {len(written)} of {len(files)} reports rewritten")
        return 0
    folder = Path(args.out or "derivations")
    written = write_derivations(folder, files, force=args.force)
    print(f"wrote {len(written)} of {len(files)} reports to {folder} (the others were up to date)")
    return 0

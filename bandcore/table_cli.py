"""``bandcore table``: build, inspect and re-certify table files; regenerate and check the shipped ``tables/``.

The shipped set (:data:`SHIPPED`) is 1-D tables for kl, tv and pearson at δ ∈ {0.01, 0.02, 0.05, 0.1, 0.2}
and a 2-D KL table over δ ∈ [0.01, 0.2] (target 1e-7), all ``.npz``, listed with sizes, certified
errors and checksums in ``tables/manifest.json``.  ``bandcore table regenerate`` rebuilds them
deterministically; ``bandcore table check-shipped`` (and a test) fails when they are stale: when the
manifest, a file's checksum or metadata disagree with the specification, or when the exact solver, recomputed
at a sample of each table's knots, no longer reproduces the stored values and slopes.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from .table_formats import FORMAT_VERSION, read_table
from .tables import L_RANGE, SHIPPED_DIR, BandTable, _stored, exact_solver, shipped_name
from .tables2d import _THRESHOLD

__all__ = ["SHIPPED", "check_shipped", "regenerate"]

#: (divergence, delta or (lo, hi), target) of every shipped table.
SHIPPED: tuple[tuple[str, Any, float], ...] = (
    *((name, delta, 1e-7) for name in ("kl", "tv", "pearson") for delta in (0.01, 0.02, 0.05, 0.1, 0.2)),
    ("kl", (0.01, 0.2), 1e-7),
)
MANIFEST = "manifest.json"


def _entry(path: Path, table) -> dict[str, Any]:
    _, meta = read_table(path)
    entry = {"file": path.name, "divergence": table.divergence_name, "table": meta["table"]}
    if meta["table"] == "2d":
        entry["delta_range"] = list(table.delta_range)
    else:
        entry["delta"] = table.delta
    entry.update(
        bytes=path.stat().st_size,
        knots=table.n_knots,
        target=table.target,
        max_rel_error=table.max_rel_error,
        checksum=meta["checksum"],
    )
    return entry


def regenerate(directory: Path = SHIPPED_DIR, *, progress: bool = True) -> list[dict[str, Any]]:
    """Rebuild every shipped table and the manifest in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, delta, target in SHIPPED:
        table = BandTable.build(name, delta, target=target, progress=progress)
        path = table.save(directory / shipped_name(name, delta))
        entries.append(_entry(path, table))
    manifest = {
        "format_version": FORMAT_VERSION,
        "regenerate": "bandcore table regenerate",
        "error_measure": "|Δ log r| / max(1, |log r|) against the exact solver",
        "tables": entries,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return entries


def _sample_knots(n: int, k: int, seed: int) -> np.ndarray:
    return np.unique(np.concatenate([[0, n - 1], np.random.default_rng(seed).integers(0, n, k)]))


def _recompute_1d(table: BandTable, k: int, seed: int) -> float:
    """Worst relative mismatch of stored values/slopes against the exact solver at sampled knots."""
    solve = exact_solver()
    from .table_math import pieces

    parts = pieces(table.divergence)
    worst = 0.0
    for index, bound in ((0, table.lower), (1, table.upper)):
        idx = _sample_knots(len(bound.knots), k, seed + index)
        L = bound.knots[idx]
        y = np.asarray(solve(-L, table.divergence, table.delta)[index], dtype=np.float64)
        kink = bound.knots[0] if bound.saturated_left else None
        values, slopes = _stored(bound.kind, L, y, parts, kink=kink)
        for fresh, stored in ((values, bound.values[idx]), (slopes, bound.slopes[idx])):
            worst = max(worst, float(np.max(np.abs(fresh - stored) / np.maximum(1.0, np.abs(stored)))))
    return worst


def _recompute_2d(table, k: int, seed: int) -> float:
    """As :func:`_recompute_1d` at a random Chebyshev node in δ, beyond the coefficients' rounding allowance
    (n · threshold: every coefficient is within the threshold of its exact value, and |T_k| <= 1)."""
    from .table_math import pieces
    from .tables2d import _lobatto

    solve = exact_solver()
    parts = pieces(table.divergence)
    rng = np.random.default_rng(seed)
    lo, hi = (math.log(d) for d in table.delta_range)
    worst = 0.0
    for index, surface in ((0, table.lower), (1, table.upper)):
        n = len(surface.coef_values)
        u = float(_lobatto(n)[int(rng.integers(0, n))])
        idx = _sample_knots(len(surface.knots), k, seed + index)
        L = surface.knots[idx]
        y = np.asarray(solve(-L, table.divergence, math.exp((lo + hi) / 2 + u * (hi - lo) / 2))[index])
        values, slopes = _stored(surface.kind, L, y, parts)
        stored = surface.at(u)
        knots = surface.knots
        w = np.maximum(np.diff(knots, prepend=knots[0]), np.diff(knots, append=knots[-1]))
        scale = np.maximum(1.0, np.abs(values))
        mismatch = max(np.max(np.abs(values - stored.values[idx]) / scale),
                       np.max(np.abs(slopes - stored.slopes[idx]) * w[idx] / scale))  # fmt: skip
        worst = max(worst, float(mismatch) - n * table.target * _THRESHOLD)
    return worst


def check_shipped(directory: Path = SHIPPED_DIR, *, knots_per_table: int = 24, tol: float = 1e-9) -> list[str]:
    """Problems that make the shipped tables stale (empty list when they are fresh)."""
    problems: list[str] = []
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return [f"{manifest_path} is missing: run `bandcore table regenerate`"]
    manifest = json.loads(manifest_path.read_text())
    listed = {e["file"]: e for e in manifest.get("tables", [])}
    expected = {shipped_name(name, delta): (name, delta, target) for name, delta, target in SHIPPED}
    if set(listed) != set(expected):
        problems.append(f"manifest lists {sorted(listed)}, the specification {sorted(expected)}")
    for file, (name, delta, target) in expected.items():
        path = directory / file
        try:
            table = BandTable.load(path)
            _, meta = read_table(path)
        except (OSError, ValueError) as err:
            problems.append(f"{file}: {err}")
            continue
        entry = listed.get(file, {})
        if entry.get("checksum") != meta["checksum"] or entry.get("bytes") != path.stat().st_size:
            problems.append(f"{file}: checksum or size differs from the manifest")
        spec_delta = list(delta) if isinstance(delta, tuple) else delta
        got_delta = meta.get("delta_range") if isinstance(delta, tuple) else meta.get("delta")
        spec = (name, spec_delta, target, list(L_RANGE))
        if (meta["divergence"], got_delta, meta["target"], meta["L_range"]) != spec:
            problems.append(f"{file}: metadata does not match the specification ({name}, {delta}, {target})")
        if not (math.isfinite(table.max_rel_error) and table.max_rel_error <= target):
            problems.append(f"{file}: certified error {table.max_rel_error:.2e} above its target {target:g}")
        recompute = _recompute_2d if meta["table"] == "2d" else _recompute_1d
        mismatch = recompute(table, knots_per_table, seed=len(problems))
        if mismatch > tol:
            problems.append(f"{file}: stored knots differ from the exact solver by {mismatch:.2e} (stale)")
    return problems


# --------------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------------


def _parse_delta(text: str):
    if "," in text:
        lo, hi = text.split(",", 1)
        return (float(lo), float(hi))
    return float(text)


def _build(args: argparse.Namespace) -> int:
    table = BandTable.build(args.divergence, _parse_delta(args.delta), target=args.target, progress=not args.quiet)
    path = table.save(args.out)
    print(f"{table!r} -> {path} ({path.stat().st_size:,} bytes)")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    table = BandTable.load(args.file)
    _, meta = read_table(args.file)
    print(repr(table))
    for key in sorted(meta):
        print(f"  {key}: {meta[key]}")
    return 0


def _check(args: argparse.Namespace) -> int:
    table = BandTable.load(args.file)
    measured = table.recertify(args.points)
    ok = measured <= table.max_rel_error
    print(
        f"{table!r}: re-measured max error {measured:.3e} on {args.points} points per interval "
        f"({'within' if ok else 'ABOVE'} the certified {table.max_rel_error:.3e})"
    )
    return 0 if ok else 1


def _regenerate(args: argparse.Namespace) -> int:
    for entry in regenerate(Path(args.dir), progress=not args.quiet):
        print(
            f"{entry['file']}: {entry['bytes']:,} bytes, {entry['knots']} knots, "
            f"max_rel_error {entry['max_rel_error']:.2e}"
        )
    return 0


def _check_shipped(args: argparse.Namespace) -> int:
    problems = check_shipped(Path(args.dir))
    for problem in problems:
        print(f"stale: {problem}")
    if not problems:
        print(f"{len(SHIPPED)} shipped tables are fresh")
    return 1 if problems else 0


def register_cli(subparsers) -> None:
    """Add ``bandcore table build|inspect|check|regenerate|check-shipped``."""
    p = subparsers.add_parser("table", help="build, inspect and check lookup tables with a certified error")
    sub = p.add_subparsers(dest="table_command", required=True, metavar="ACTION")
    b = sub.add_parser("build", help="tabulate a divergence at one delta (or a range lo,hi for a 2-D table)")
    b.add_argument("--divergence", required=True, help="name or alias, e.g. kl")
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
    r.add_argument("--dir", default=str(SHIPPED_DIR), help="directory (default: the repository's tables/)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    r.set_defaults(handler=_regenerate)
    s = sub.add_parser("check-shipped", help="fail when the shipped tables are stale")
    s.add_argument("--dir", default=str(SHIPPED_DIR), help="directory (default: the repository's tables/)")
    s.set_defaults(handler=_check_shipped)

"""The tables shipped in the package (``bandcore/tables/data``): their specification, regeneration, freshness.

The shipped set (:data:`SHIPPED`) is 1-D tables at δ ∈ {0.01, 0.02, 0.05, 0.1, 0.2} for every catalogue
divergence (:data:`SHIPPED_NAMES`; every saturating lower bound, and the singular upper bounds of js and
reverse_kl, split at the saturation threshold, see :mod:`bandcore.tables.threshold`), α = ½, 0.7 and −1 of
the α-family, and 2-D tables over δ ∈ [0.01, 0.2] (:data:`SHIPPED_DELTA_RANGE`) for the same divergences
(:data:`SHIPPED_NAMES_2D`): KL, Neyman and α = −1 never saturate; the bounds of the others that saturate are
split at the threshold L*(δ) recomputed for each δ (:mod:`bandcore.tables.grid2d`), with logarithmic tails where
they need them (reverse KL); all at target 1e-7, all ``.npz``, listed
with sizes, certified errors and checksums in ``manifest.json``.  :func:`regenerate` rebuilds them; a build depends
on its inputs only (no clock, no thread count: ``tests/tables/test_tables_determinism.py``), so regenerating
unchanged code reproduces every file byte for byte;
:func:`check_shipped` (``bandcore table check-shipped``, and a test) reports them stale when the manifest, a
file's checksum or metadata disagree with the specification, or when the exact solver, recomputed at a sample
of each table's knots, no longer reproduces the stored values and slopes (for a split 2-D bound: its far knots
and, at that δ's recomputed threshold, its near knots).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..divergences.catalogue import CATALOGUE
from .chebyshev import THRESHOLD, lobatto
from .formats import FORMAT_VERSION, SHIPPED_DIR, read_table, shipped_name
from .limits import L_RANGE
from .near import near_samples
from .pieces import pieces
from .split2d import exact_threshold
from .table import BandTable
from .tabulated import exact_solver, stored
from .threshold import SplitBound, threshold_dd

__all__ = [
    "MANIFEST",
    "SHIPPED",
    "SHIPPED_ALPHAS",
    "SHIPPED_DELTAS",
    "SHIPPED_DELTA_RANGE",
    "SHIPPED_DIR",
    "SHIPPED_NAMES",
    "SHIPPED_NAMES_2D",
    "check_shipped",
    "regenerate",
]  # fmt: skip

#: the members of the α-family shipped beside every fixed-formula catalogue entry
SHIPPED_ALPHAS = ("0.5", "0.7", "-1")
#: the divergences shipped as 1-D tables at every delta of :data:`SHIPPED_DELTAS`: the catalogue and those α
SHIPPED_NAMES = (*CATALOGUE, *(f"alpha({a})" for a in SHIPPED_ALPHAS))
#: the standard delta grid
SHIPPED_DELTAS = (0.01, 0.02, 0.05, 0.1, 0.2)
#: the divergences shipped as 2-D tables over :data:`SHIPPED_DELTA_RANGE`: all of them
SHIPPED_NAMES_2D = SHIPPED_NAMES
SHIPPED_DELTA_RANGE = (0.01, 0.2)
#: (divergence, delta or (lo, hi), target) of every shipped table.
SHIPPED: tuple[tuple[str, Any, float], ...] = (
    *((name, delta, 1e-7) for name in SHIPPED_NAMES for delta in SHIPPED_DELTAS),
    *((name, SHIPPED_DELTA_RANGE, 1e-7) for name in SHIPPED_NAMES_2D),
)
MANIFEST = "manifest.json"


def _entry(path: Path, table) -> dict[str, Any]:
    _, meta = read_table(path)
    entry = {"file": path.name, "divergence": table.divergence_name, "table": meta["table"]}
    if meta["table"] == "2d":
        entry["delta_range"] = list(table.delta_range)
    else:
        entry["delta"] = table.delta
    entry.update(bytes=path.stat().st_size, knots=table.n_knots, target=table.target,
                 max_rel_error=table.max_rel_error, checksum=meta["checksum"])  # fmt: skip
    return entry


def regenerate(
    directory: Path = SHIPPED_DIR, *, progress: bool = True, overwrite: bool = False
) -> list[dict[str, Any]]:
    """Rebuild every shipped table and the manifest in ``directory`` (default: the package data folder).

    Elsewhere, existing files of the same names are not replaced unless ``overwrite`` (raises
    :class:`FileExistsError` before building anything).
    """
    directory = Path(directory)
    names = [shipped_name(name, delta) for name, delta, _ in SHIPPED] + [MANIFEST]
    if not overwrite and directory.resolve() != SHIPPED_DIR.resolve():
        existing = [n for n in names if (directory / n).exists()]
        if existing:
            raise FileExistsError(f"{directory} already holds {', '.join(existing[:3])}"
                                  f"{' ...' if len(existing) > 3 else ''}: pass --force to replace them")  # fmt: skip
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
    """Worst relative mismatch of stored values and slopes against the exact solver at sampled knots, a slope's
    times its cell's width (:func:`_differences`)."""
    solve = exact_solver()
    div = table.divergence
    parts = pieces(div)
    worst = 0.0
    for index, bound in ((0, table.lower), (1, table.upper)):
        if isinstance(bound, SplitBound):  # the far part; the near part's threshold is recomputed
            side = "upper" if index else "lower"
            _, star_lo, _ = threshold_dd(div, table.delta, side, bound.star_hi)
            worst = max(worst, abs(star_lo - bound.star_lo) / np.spacing(bound.star_hi))
            bound = bound.far
        idx = _sample_knots(len(bound.knots), k, seed + index)
        L = bound.knots[idx]
        y = np.asarray(solve(-L, div, table.delta)[index], dtype=np.float64)
        kink = bound.knots[0] if bound.saturated_left else None
        values, slopes = stored(bound.kind, L, y, parts, kink=kink)
        worst = max(worst, _differences(bound.knots, idx, values, slopes, bound.values[idx], bound.slopes[idx]))
    return worst


def _differences(knots, idx, values, slopes, stored_values, stored_slopes) -> float:
    """Largest relative difference of recomputed values and slopes at knots ``idx``, a slope's times the width of
    the wider cell at its knot: what it moves the cubic by.  A slope near p = 1 (L ~ 1e-14) is computed with a
    cancellation of ~1e-16/L relative, whose digits differ between NumPy builds (its exp and log with AVX-512 or
    without); the cell there is ~L wide, so a stale table still shows and those digits do not."""
    w = np.maximum(np.diff(knots, prepend=knots[0]), np.diff(knots, append=knots[-1]))[idx]
    scale = np.maximum(1.0, np.abs(values))
    with np.errstate(invalid="ignore"):
        slope_difference = np.where(slopes == stored_slopes, 0.0, np.abs(slopes - stored_slopes) * w / scale)
    return float(max(np.max(np.abs(values - stored_values) / scale), np.max(slope_difference)))


def _recompute_2d(table, k: int, seed: int) -> float:
    """As :func:`_recompute_1d` at a random Chebyshev node in δ (of a random δ-piece of a saturating bound: far
    knots by the float64 solver, near knots by :func:`~bandcore.tables.near.near_samples` at that δ's exact
    threshold), beyond the coefficients' rounding allowance (n · threshold: every coefficient is within the
    threshold of its exact value, and |T_k| <= 1)."""
    solve = exact_solver()
    div = table.divergence
    parts = pieces(div)
    rng = np.random.default_rng(seed)
    lo, hi = (math.log(d) for d in table.delta_range)
    worst = 0.0
    for index, side in enumerate(("lower", "upper")):
        surface = getattr(table, side)
        piece = surface[int(rng.integers(0, len(surface)))] if isinstance(surface, tuple) else None
        grid = surface if piece is None else piece.far
        n = len(grid.coef_values)
        v = float(lobatto(n)[int(rng.integers(0, n))])
        u = v if piece is None else (sum(piece.u_range) + v * (piece.u_range[1] - piece.u_range[0])) / 2
        delta = math.exp((lo + hi) / 2 + u * (hi - lo) / 2)
        idx = _sample_knots(len(grid.knots), k, seed + index)
        L = grid.knots[idx]
        values, slopes = stored(grid.kind, L, np.asarray(solve(-L, div, delta)[index]), parts)
        worst = max(worst, _mismatch(grid, v, idx, values, slopes) - n * table.target * THRESHOLD)
        if piece is not None:
            star, b, _ = exact_threshold(div, delta, side)
            idx = _sample_knots(len(piece.near.knots), k, seed + index)
            values, slopes = near_samples(div, delta, side, star, b, piece.gamma, piece.near.knots[idx], solve, {})
            at_v = piece.near.at(v)
            fresh, kept = (values, slopes), (at_v.values[idx], at_v.slopes[idx])
            if side == "upper":
                lam = piece.near.knots[idx]
                fresh, kept = _upper_gap(lam, piece.gamma, *fresh), _upper_gap(lam, piece.gamma, *kept)
            mismatch = _differences(piece.near.knots, idx, *fresh, *kept)
            worst = max(worst, mismatch - n * table.target * THRESHOLD)
    return worst


def _upper_gap(lam: np.ndarray, gamma: float, g: np.ndarray, dg: np.ndarray,
               power: int = 0) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(u, du/dλ) of an upper bound's near part from its stored (G, dG/dλ), u = e^G λ^γ = 1 - p r_up, or with
    ``power`` k from its (H, dH/dλ), u = H λ^k: the bound is log r_up = L + log(1 - u), so a difference in G moves
    it by u ΔG.  Near the threshold u is some 1e-16 (γ = 2 at λ = 1e-8) and G, computed from it by the float64
    solver above the 50-digit one's range, carries that rounding (a few per cent, differing between NumPy builds'
    exp and log), which the bound does not feel."""
    if power:
        return g * lam**power, dg * lam**power + power * g * lam ** (power - 1)
    u = np.exp(g) * lam**gamma
    return u, u * (dg + gamma / lam)


def _mismatch(surface, v: float, idx: np.ndarray, values: np.ndarray, slopes: np.ndarray) -> float:
    """Largest relative difference of recomputed values and slopes (times the cell width) at knots ``idx``."""
    at_v = surface.at(v)
    return _differences(surface.knots, idx, values, slopes, at_v.values[idx], at_v.slopes[idx])


def check_shipped(directory: Path = SHIPPED_DIR, *, knots_per_table: int = 24, tol: float = 1e-9) -> list[str]:
    """Problems that make the shipped tables in ``directory`` stale (empty list when they are fresh)."""
    directory = Path(directory)
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

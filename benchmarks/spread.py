"""The spread of several ``bandcore bench`` runs (``--from-json F1 F2 ...``): per token distribution, every
(divergence, method, size) as the median over the runs and its range [min – max] of each run's median
ns/token (1 thread, all threads), × exp pass and × published (over the published solver computing in the
runs' ``baseline_dtype``, named in the column), the backend ``band()``'s default ran and its first call, and the
user generators' ratio to the catalogue divergence nearest in cost.  Every ratio is measured within one run
(medians of the same interleaved rounds)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from .report import (
    auto_lines,
    backends_text,
    baseline_dtype,
    by_row,
    first_call_intro,
    label,
    ns,
    ratio,
    size_label,
    versus_published,
)

__all__ = ["check_comparable", "format_spread"]

#: settings that must agree between the runs of a spread (else their times are not of the same thing)
_SAME_IN_EVERY_RUN = ("sizes", "delta", "threads", "dtype", "rounds", "min_round_seconds", "distributions")


def check_comparable(reports: list[dict[str, Any]], names: list[str]) -> None:
    """Raise ValueError naming the first file whose settings differ from the first one's (or whose published
    solver computed in another dtype)."""
    for report, name in zip(reports[1:], names[1:], strict=True):
        if baseline_dtype(report) != baseline_dtype(reports[0]):
            raise ValueError(f"--from-json: {name}'s published solver computed in {baseline_dtype(report)}, "
                             f"{names[0]}'s in {baseline_dtype(reports[0])}: the runs of a spread must share "
                             "their baseline")  # fmt: skip
        for key in _SAME_IN_EVERY_RUN:
            if report.get(key) != reports[0].get(key):
                raise ValueError(f"--from-json: {name} has {key} = {report.get(key)!r}, {names[0]} has "
                                 f"{reports[0].get(key)!r}: the runs of a spread must share "
                                 f"{', '.join(_SAME_IN_EVERY_RUN)}")  # fmt: skip


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    """``median [min – max]`` (the median alone for one value; ``–`` for none)."""
    if not values:
        return "–"
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} [{fmt(min(values))} – {fmt(max(values))}]"


def _versus(rows: list[dict[str, Any]], key: str) -> str:
    if not rows or rows[0]["kind"] == "unit":
        return "–"
    pairs = [versus_published(row, key) for row in rows]
    values = [v for v, _ in pairs if v is not None]
    if len(values) != len(pairs) or not values:
        return "–"
    return pairs[0][1] + spread(values, ratio)


def _table(reports: list[dict[str, Any]], distribution: str) -> list[str]:
    sizes, threads, dtype = reports[0]["sizes"], reports[0]["threads"], baseline_dtype(reports[0])
    head = ["divergence", "method", "runs"]
    for n in sizes:
        tokens = size_label(n)
        head += [f"ns/token 1 thr ({tokens})", f"ns/token {threads} thr ({tokens})", f"× exp pass 1 thr ({tokens})",
                 f"× published {dtype} 1 thr ({tokens})", f"× published {dtype} {threads} thr ({tokens})"]  # fmt: skip
    head += ["max error, worst run", "contract, every run"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    grouped: dict[tuple[str, str], list[dict[int, dict[str, Any]]]] = {}
    for report in reports:
        for key, per_size in by_row(report, distribution).items():
            grouped.setdefault(key, []).append(per_size)
    for (divergence, method), runs in grouped.items():
        cells = [divergence, label(reports[0], method), str(len(runs))]
        for n in sizes:
            rows = [run[n] for run in runs if n in run]
            cells += [spread([r["ns_per_token"]["1"] for r in rows], ns),
                      spread([r["ns_per_token"]["all"] for r in rows], ns),
                      spread([r["x_exp_pass"]["1"] for r in rows if r["x_exp_pass"]["1"] is not None], ratio),
                      _versus(rows, "1"), _versus(rows, "all")]  # fmt: skip
        rows = [row for run in runs for row in run.values()]
        if rows[0]["kind"] == "unit":
            cells += ["", ""]
        else:
            errors = [row["max_rel_err"] for row in rows]
            cells.append("not finite" if None in errors else f"{max(errors):.1e}")
            verdicts = {row["within_contract"] for row in rows}
            cells.append("none" if verdicts == {None} else "ok" if verdicts == {True} else "EXCEEDED")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _nearest(reports: list[dict[str, Any]], distribution: str) -> list[str]:
    grouped: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for report in reports:
        for row in report["results"]:
            if row["distribution"] == distribution and row.get("nearest_catalogue"):
                grouped.setdefault((row["divergence"], row["method"], row["n_tokens"]), []).append(row)
    if not grouped:
        return []
    threads = reports[0]["threads"]
    lines = ["", "| user generator | method | tokens | nearest in cost (runs) | × its time, 1 thr | "
             f"× its time, {threads} thr |", "|" + " --- |" * 6]  # fmt: skip
    for (divergence, method, n), rows in grouped.items():
        near = [row["nearest_catalogue"][key] for row in rows for key in ("1", "all")]
        names = sorted({f"{x['divergence']} ({x['transcendentals']})" for x in near if x is not None})
        cells = [divergence, label(reports[0], method), size_label(n), ", ".join(names) or "–"]
        for key in ("1", "all"):
            values = [row["nearest_catalogue"][key]["ratio"] for row in rows if row["nearest_catalogue"][key]]
            cells.append(spread(values, ratio))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _first_calls(reports: list[dict[str, Any]]) -> list[str]:
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for report in reports:
        for row in report.get("first_calls") or []:
            grouped.setdefault((row["divergence"], row["n_tokens"]), []).append(row)
    if not grouped:
        return []
    lines = ["", first_call_intro(reports[0]), "",
             "| divergence | tokens | runs | ran | first call | later calls | later ran |",
             "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for (divergence, n), rows in grouped.items():
        done = [row for row in rows if "error" not in row]
        cells = [divergence, size_label(n), str(len(rows))]
        if not done:
            cells += [rows[0]["error"], "", "", ""]
        else:
            cells += [backends_text([row["backend"] for row in done]),
                      spread([row["first_call_seconds"] for row in done], lambda s: f"{s:.3g} s"),
                      spread([row["next_call_seconds"] * 1e3 for row in done], lambda s: f"{s:.3g} ms"),
                      backends_text([row["next_backend"] for row in done])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def format_spread(reports: list[dict[str, Any]]) -> str:
    """Markdown: per distribution, every (divergence, method, size) over several runs as median [min – max]
    of the runs' medians; the worst error of any run and whether every run kept the contract."""
    first = reports[0]
    dtype = baseline_dtype(first)
    lines = [f"{len(reports)} runs of `bandcore bench`, δ = {first['delta']}, 1 and {first['threads']} threads, "
             f"each time the median of {first['rounds']} interleaved rounds; every column is the median over the "
             f"runs [min – max]. × published {dtype}: over the published solver computing in {dtype} (the "
             "divergence's own, else the published KL solver), same run, equal threads.", ""]  # fmt: skip
    for report in reports:
        start = report["machine"].get("load_average_start")
        load = f", load average {start[0]:g} at its start" if start else ""
        lines.append(f"- `{report['command']}` (seed {report['seed']}, {report['date']}{load})")
    for distribution in first["distributions"]:
        lines += ["", f"### Distribution `{distribution}`: {first['generators'][distribution]}", ""]
        lines += _table(reports, distribution)
        lines += auto_lines(reports, distribution)
        lines += _nearest(reports, distribution)
    lines += _first_calls(reports)
    return "\n".join(lines) + "\n"

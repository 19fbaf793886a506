"""The benchmark report as text and as Markdown, both generated from the JSON report of
:func:`bandcore.tools.bench.run_bench` (``bandcore bench --from-json F --markdown G`` re-renders a saved run),
and the spread over several runs (``--from-json F1 F2 ...``): every time and ratio as its median and range."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["check_comparable", "format_markdown", "format_report", "format_spread", "size_label"]

_LABELS = {
    "published": "published solver",
    "published-1t": "published solver, 1 thread (extra row)",
    "numpy": "exact, NumPy",
    "numba": "exact, Numba",
    "torch": "exact, torch",
    "table": "table (NumPy in, Numba kernel)",
    "table-torch": "table (torch in, Numba kernel)",
    "roofline": "copy roofline (bound)",
}


def size_label(n: int) -> str:
    """``1000000`` -> ``1M``, ``10000`` -> ``10k``, ``12345`` -> ``12,345``."""
    for factor, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{suffix}"
    return f"{n:,}"


def _ratio(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 1:
        return f"{value:.2g}×"
    return f"{value:.2f}×" if value < 10 else f"{value:.0f}×"


def _ms(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def _percent(fraction: float) -> str:
    value = 100 * fraction
    return f"{value:.0f}%" if value >= 10 else f"{value:.1f}%" if value >= 1 else f"{value:.2g}%"


def _error(value: float | None) -> str:
    return "not finite" if value is None else f"{value:.1e}"


def _contract(row: dict[str, Any]) -> str:
    if row["kind"] == "roofline":
        return ""
    if row["contract"] is None:
        return "none"
    kind = "certified" if row["kind"] == "table" else "contract"
    verdict = "ok" if row["within_contract"] else "EXCEEDED"
    return f"≤ {row['contract']:.1e} ({kind}): {verdict}"


def _header(report: dict[str, Any]) -> list[str]:
    copy, machine = report["copy"], report["machine"]
    llc = copy["llc"]
    llc_text = f"L{llc['level']} {llc['bytes'] / 2**20:g} MiB" if llc.get("level") else f"{llc['bytes'] / 2**20:g} MiB"
    copies = ", ".join(f"{name} {m['gb_per_s']:.1f} GB/s ({m['threads']} thr)" for name, m in copy["methods"].items())
    start, end = machine.get("load_average_start"), machine.get("load_average_end")
    load = "" if not start else f"; load average (1 min) {start[0]:g} at the start" + (
        f", {end[0]:g} at the end" if end else "")  # fmt: skip
    lines = [
        f"{machine['cpu_count']} CPUs ({machine['processor']}){load}; threads: {report['thread_note']}.",
        f"Roofline: copy of {copy['array_bytes'] / 2**20:g} MiB arrays (last-level cache {llc_text}, from "
        f"{llc['source']}): {copies} -> {copy['gb_per_s']:.1f} GB/s = {copy['roofline_mtok_s']:.0f} Mtok/s at "
        f"{copy['bytes_per_token']} B/token.",
    ]
    if "note" in copy:
        lines.append(f"Note: {copy['note']}.")
    lines.append(
        f"Inputs: float32 log-probs ({report['generator']}), δ = {report['delta']}, seed {report['seed']}; "
        f"{report['timing']}."
    )
    lines.append(f"Error: {report['accuracy_measure']}, on {report['accuracy_points']} points.")
    lines.append(
        f"bandcore {report['bandcore_version']}, Python {machine['python']}, NumPy {machine['numpy']}, "
        f"torch {machine['torch']}, Numba {machine['numba']}; {machine['platform']}; {report['date']}."
    )
    return lines


def _by_row(report: dict[str, Any]) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """(divergence, method) -> size -> row, in the report's order."""
    grouped: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for row in report["results"]:
        grouped.setdefault((row["divergence"], row["method"]), {})[row["n_tokens"]] = row
    return grouped


def format_markdown(report: dict[str, Any]) -> str:
    """The Markdown tables (with the exact command line) of a JSON report; README's results are pasted from it."""
    sizes = report["sizes"]
    lines = [f"Command: `{report['command']}`", ""]
    lines += [f"- {line}" for line in _header(report)]
    head = ["divergence", "method", "threads"]
    for n in sizes:
        label = size_label(n)
        head += [f"ms ({label})", f"× published ({label})", f"% roofline ({label})"]
    head += ["max error lower / upper", "contract"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for (divergence, method), per_size in _by_row(report).items():
        first = next(iter(per_size.values()))
        cells = [divergence, _LABELS.get(method, method), str(first["threads"])]
        for n in sizes:
            row = per_size.get(n)
            if row is None:
                cells += ["–", "–", "–"]
                continue
            cells += [_ms(row["seconds"]), _ratio(row["speedup_vs_published"]),
                      _percent(row["roofline_fraction"])]  # fmt: skip
        if first["kind"] == "roofline":
            cells.append("")
        else:
            cells.append(f"{_error(first['max_rel_err_lower'])} / {_error(first['max_rel_err_upper'])}")
        cells.append(_contract(first))
        lines.append("| " + " | ".join(cells) + " |")
    if report["tables"]:
        lines += ["", "| table | origin | knots | certified max error |", "| --- | --- | --- | --- |"]
        for name, info in report["tables"].items():
            lines.append(f"| {name} | {info['origin']} | {info['knots']} | {info['certified_max_rel_error']:.1e} |")
    if report.get("memory"):
        lines += ["", "| peak memory (KL) | tokens | extra MB | × input | × the two outputs |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for row in report["memory"]:
            if "error" in row:
                lines.append(f"| {row['method']} | {row['n_tokens']:,} | {row['error']} | | |")
            else:
                lines.append(
                    f"| {row['method']} | {row['n_tokens']:,} | {row['peak_extra_bytes'] / 1e6:.1f} | "
                    f"{row['peak_over_input']:.2f} | {row['peak_over_outputs']:.2f} |"
                )
    if report["unavailable"]:
        lines.append("")
        lines += [f"- unavailable {key}: {why}" for key, why in report["unavailable"].items()]
    return "\n".join(lines) + "\n"


def format_report(report: dict[str, Any]) -> str:
    """The plain-text table ``bandcore bench`` prints (one line per divergence, method and size)."""
    lines = [f"bandcore bench: {report['command']}", *_header(report), ""]
    lines.append(
        f"{'divergence':<10} {'method':<12} {'tokens':>9} {'thr':>3} {'ms':>10} {'Mtok/s':>9} {'x publ.':>8} "
        f"{'x exact':>8} {'roofline':>8} {'err lower':>10} {'err upper':>10} {'1st call s':>10}"
    )
    for (divergence, method), per_size in _by_row(report).items():
        for n, row in per_size.items():
            publ = "-" if row["speedup_vs_published"] is None else f"{row['speedup_vs_published']:.2f}"
            exact = "-" if row["speedup_vs_best_exact"] is None else f"{row['speedup_vs_best_exact']:.2f}"
            first = "-" if row["first_call_seconds"] is None else f"{row['first_call_seconds']:.3f}"
            errors = ("", "") if row["kind"] == "roofline" else (
                _error(row["max_rel_err_lower"]), _error(row["max_rel_err_upper"]))  # fmt: skip
            lines.append(
                f"{divergence:<10} {method:<12} {size_label(n):>9} {row['threads']:>3} {row['seconds'] * 1e3:10.3f} "
                f"{row['mtok_s']:9.2f} {publ:>8} {exact:>8} {row['roofline_fraction']:8.1%} {errors[0]:>10} "
                f"{errors[1]:>10} {first:>10}"
            )
    for name, info in report["tables"].items():
        lines.append(
            f"table {name}: {info['origin']} ({info['seconds']:.2f} s), {info['knots']} knots, "
            f"certified max rel error {info['certified_max_rel_error']:.2e}"
        )
    for row in report.get("memory", []):
        if "error" in row:
            lines.append(f"memory {row['method']:<6} {row['n_tokens']:>10,} tokens: {row['error']}")
        else:
            lines.append(
                f"memory {row['method']:<6} {row['n_tokens']:>10,} tokens: peak +{row['peak_extra_bytes'] / 1e6:.1f} MB"
                f" = {row['peak_over_input']:.2f} x input ({row['peak_over_outputs']:.2f} x the two outputs)"
            )
    for key, why in report["unavailable"].items():
        lines.append(f"unavailable {key}: {why}")
    for (divergence, method), per_size in _by_row(report).items():
        row = next(iter(per_size.values()))
        if row["within_contract"] is False:
            error = _error(row["max_rel_err"])
            lines.append(f"ABOVE CONTRACT: {divergence} {method}: error {error} > {row['contract']:.1e}")
    return "\n".join(lines)


#: settings that must agree between the runs of a spread (else their times are not of the same thing)
_SAME_IN_EVERY_RUN = ("sizes", "delta", "threads", "dtype", "repeats")


def check_comparable(reports: list[dict[str, Any]], names: list[str]) -> None:
    """Raise ValueError naming the first file whose settings differ from the first one's."""
    for report, name in zip(reports[1:], names[1:], strict=True):
        for key in _SAME_IN_EVERY_RUN:
            if report.get(key) != reports[0].get(key):
                raise ValueError(f"--from-json: {name} has {key} = {report.get(key)!r}, {names[0]} has "
                                 f"{reports[0].get(key)!r}: the runs of a spread must share "
                                 f"{', '.join(_SAME_IN_EVERY_RUN)}")  # fmt: skip


def _spread(values: list[float], fmt) -> str:
    """``median [min – max]`` (the median alone for one value)."""
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} [{fmt(min(values))} – {fmt(max(values))}]"


def _versus_published_kl(report: dict[str, Any], row: dict[str, Any]) -> float | None:
    """The published KL solver's time over ``row``'s, in the same run at the same size (None without it)."""
    for other in report["results"]:
        if (other["divergence"], other["method"], other["n_tokens"]) == ("kl", "published", row["n_tokens"]):
            return other["seconds"] / row["seconds"]
    return None


def format_spread(reports: list[dict[str, Any]]) -> str:
    """Markdown: every (divergence, method, size) over several runs, its time, its ratio to its own published
    solver and to the published KL solver (each run's), as median [min – max]; the worst error of any run and
    whether every run kept the contract."""
    first = reports[0]
    sizes = first["sizes"]
    lines = [f"{len(reports)} runs of `bandcore bench`, δ = {first['delta']}, {first['threads']} threads, best of "
             f"{first['repeats']} repeats each; time and × published as median [min – max] over the runs.", ""]
    for report in reports:
        start = report["machine"].get("load_average_start")
        load = f", load average {start[0]:g} at its start" if start else ""
        lines.append(f"- `{report['command']}` (seed {report['seed']}, {report['date']}{load})")
    head = ["divergence", "method", "runs"]
    for n in sizes:
        head += [f"ms ({size_label(n)})", f"× published ({size_label(n)})", f"× published KL ({size_label(n)})"]
    head += ["max error, worst run", "contract, every run"]
    lines += ["", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    grouped: dict[tuple[str, str], list[tuple[dict[str, Any], dict[int, dict[str, Any]]]]] = {}
    for report in reports:
        for key, per_size in _by_row(report).items():
            grouped.setdefault(key, []).append((report, per_size))
    for (divergence, method), runs in grouped.items():
        cells = [divergence, _LABELS.get(method, method), str(len(runs))]
        for n in sizes:
            rows = [(report, run[n]) for report, run in runs if n in run]
            cells.append(_spread([row["seconds"] for _, row in rows], _ms) if rows else "–")
            ratios = [row["speedup_vs_published"] for _, row in rows if row["speedup_vs_published"] is not None]
            cells.append(_spread(ratios, _ratio) if ratios else "–")
            versus_kl = [_versus_published_kl(report, row) for report, row in rows]
            cells.append(_spread(versus_kl, _ratio) if rows and None not in versus_kl else "–")
        rows = [row for _, run in runs for row in run.values()]
        if rows[0]["kind"] == "roofline":
            cells += ["", ""]
        else:
            errors = [row["max_rel_err"] for row in rows]
            cells.append("not finite" if None in errors else f"{max(errors):.1e}")
            verdicts = {row["within_contract"] for row in rows}
            cells.append("none" if verdicts == {None} else "ok" if verdicts == {True} else "EXCEEDED")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"

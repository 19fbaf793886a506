"""The benchmark report as text and as Markdown, both generated from the JSON report of
:func:`benchmarks.bench.run_bench` (``bandcore bench --from-json F --markdown G`` re-renders a saved run).
One block per token distribution; every time is a median over interleaved rounds (the JSON keeps each round,
the quartiles and the range).  The baseline of every "× published" column is named with the dtype it computed
in (:func:`baseline_dtype`: float32 in this version's runs); a note says which backend ``band()``'s default ran,
and a table what a user's first call took (``first_calls``)."""

from __future__ import annotations

from typing import Any

__all__ = ["LABELS", "auto_lines", "auto_note", "backends_text", "baseline_dtype", "by_row", "check_format",
           "first_call_intro", "format_markdown", "format_report", "label", "ns", "ratio", "size_label"]

LABELS = {
    "published": "published solver",  # with its dtype: label()
    "published-fp64": "published solver, float64 input",
    "auto": "exact, band() default (auto)",
    "numpy": "exact, NumPy",
    "numba": "exact, Numba",
    "torch": "exact, torch",
    "table": "table (NumPy in, Numba kernel)",
    "table-torch": "table (torch in, Numba kernel)",
    "exp_pass": "np.exp pass (the unit)",
}


def check_format(report: Any, name: str) -> None:
    """Raise ValueError unless ``report`` (read from file ``name``) is a report of this ``bandcore bench``: one with
    distributions and interleaved rounds (an earlier version's best-of-repeats report is refused, not misread)."""
    keys = ("distributions", "generators", "rounds", "threads", "results")
    if not isinstance(report, dict) or any(key not in report for key in keys) or not all(
        isinstance(row, dict) and "times" in row and "x_exp_pass" in row for row in report["results"]
    ):
        raise ValueError(
            f"--from-json: {name} is not a report of this bandcore bench (interleaved rounds, distributions); "
            "reports of earlier versions are not read: run bandcore bench again"
        )


def baseline_dtype(report: dict[str, Any]) -> str:
    """The dtype the report's ``published`` row (the baseline) computed in: its ``baseline_dtype``, or float64 for a
    report saved before the baseline ran on float32 (the published solver then cast its input to float64)."""
    return report.get("baseline_dtype", "float64")


def label(report: dict[str, Any], method: str) -> str:
    """The method's name in the tables; the published solver's with the dtype it computed in."""
    if method == "published":
        return f"published solver, {baseline_dtype(report)} (the baseline)"
    return LABELS.get(method, method)


def size_label(n: int) -> str:
    """``1000000`` -> ``1M``, ``10000`` -> ``10k``, ``12345`` -> ``12,345``."""
    for factor, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{suffix}"
    return f"{n:,}"


def ratio(value: float | None) -> str:
    """A ratio with 2 significant digits below 10, whole above (``–`` for None)."""
    if value is None:
        return "–"
    if value < 1:
        return f"{value:.2g}×"
    return f"{value:.2f}×" if value < 10 else f"{value:.0f}×"


def ns(value: float) -> str:
    """Nanoseconds per token, 3 significant digits (whole above 100)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _error(value: float | None) -> str:
    return "not finite" if value is None else f"{value:.1e}"


def _contract(row: dict[str, Any]) -> str:
    if row["kind"] == "unit":
        return ""
    if row["contract"] is None:
        return "none"
    kind = "certified" if row["kind"] == "table" else "contract"
    verdict = "ok" if row["within_contract"] else "EXCEEDED"
    return f"≤ {row['contract']:.1e} ({kind}): {verdict}"


def versus_published(row: dict[str, Any], key: str) -> tuple[float | None, str]:
    """(ratio, "" or "KL ") against the divergence's own published solver, else the published KL solver."""
    own = row["speedup_vs_published"][key]
    if own is not None:
        return own, ""
    return row["speedup_vs_published_kl"][key], "KL "


def _header(report: dict[str, Any]) -> list[str]:
    copy, machine = report["copy"], report["machine"]
    copies = ", ".join(f"{name} {m['gb_per_s']:.1f} GB/s ({m['threads']} thr)" for name, m in copy["methods"].items())
    start, end = machine.get("load_average_start"), machine.get("load_average_end")
    load = "" if not start else f"; load average (1 min) {start[0]:g} at the start" + (
        f", {end[0]:g} at the end" if end else "")  # fmt: skip
    if "run_seconds" in machine:
        load += f"; the run took {machine['run_seconds']:.0f} s ({machine['run_cpu_seconds']:.0f} s of CPU)"
    outputs = f"Outputs: {report['outputs']}. " if "outputs" in report else ""  # (runs saved before it was said)
    cpu = machine.get("cpu_model", machine["processor"])  # (runs saved before the model was recorded)
    if machine.get("vector_extensions"):
        cpu += f", {' '.join(machine['vector_extensions'])}"
    lines = [
        f"{machine['cpu_count']} CPUs ({cpu}){load}; threads: {report['thread_note']}.",
        "Threads per side: " + "; ".join(f"{k}: {v}" for k, v in report["thread_setting"].items()) + ".",
        f"Times: {report['timing']}. × exp pass: the row's median over the np.exp pass's median (same rounds, "
        f"1 thread); × published ({baseline_dtype(report)}): over the divergence's published solver computing in "
        f"{baseline_dtype(report)}, or (KL) the published KL solver of the same run, at equal threads.",
        f"Roofline: copy of {copy['array_bytes'] / 2**20:g} MiB arrays: {copies} -> {copy['gb_per_s']:.1f} GB/s.",
        f"Inputs: float32 log-probs, δ = {report['delta']}, seed {report['seed']}. {outputs}"
        f"Error: {report['accuracy_measure']}, on {report['accuracy_points']} points.",
        f"bandcore {report['bandcore_version']}, Python {machine['python']}, NumPy {machine['numpy']}, "
        f"torch {machine['torch']}, Numba {machine['numba']}; {machine['platform']}; {report['date']}.",
    ]
    return lines


def by_row(report: dict[str, Any], distribution: str) -> dict[tuple[str, str], dict[int, dict[str, Any]]]:
    """(divergence, method) -> size -> row of one distribution, in the report's order."""
    grouped: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for row in report["results"]:
        if row["distribution"] == distribution:
            grouped.setdefault((row["divergence"], row["method"]), {})[row["n_tokens"]] = row
    return grouped


def _nearest_lines(report: dict[str, Any], distribution: str) -> list[str]:
    rows = [r for r in report["results"] if r["distribution"] == distribution and r.get("nearest_catalogue")]
    if not rows:
        return []
    threads = report["threads"]
    lines = ["", "User generators beside the catalogue divergence of this run nearest in cost (closest count of "
             "transcendental nodes, ties to the faster):", "",
             f"| user generator | method | tokens | transcendentals | nearest (1 thr) | × its time (1 thr) | "
             f"nearest ({threads} thr) | × its time ({threads} thr) |", "|" + " --- |" * 8]  # fmt: skip
    for row in rows:
        cells = [row["divergence"], label(report, row["method"]), size_label(row["n_tokens"]),
                 str(row["transcendentals"])]  # fmt: skip
        for key in ("1", "all"):
            near = row["nearest_catalogue"][key]
            cells += ["–", "–"] if near is None else [f"{near['divergence']} ({near['transcendentals']})",
                                                      ratio(near["ratio"])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def backends_text(backends: list[str]) -> str:
    """One backend per run: the backend when every run had the same, else each with its count of runs."""
    if len(set(backends)) == 1:
        return backends[0]
    return ", ".join(f"{b} in {backends.count(b)} of {len(backends)} runs" for b in sorted(set(backends)))


def auto_note(picked: dict[tuple[str, int], list[str]]) -> str:
    """What ``band()``'s default ran in the timed rounds: ``picked`` maps (divergence, size) to the backend of each
    run (one run, or several for a spread)."""
    every = {backends_text(backends) for backends in picked.values()}
    intro = "band() with its default backend (auto) ran"
    if len(every) == 1:
        return f"{intro} {every.pop()} in every block of the timed rounds."
    cells = "; ".join(f"{divergence} {size_label(n)}: {backends_text(backends)}"
                      for (divergence, n), backends in picked.items())  # fmt: skip
    return f"{intro}, in the timed rounds: {cells}."


def _picked(reports: list[dict[str, Any]], distribution: str) -> dict[tuple[str, int], list[str]]:
    picked: dict[tuple[str, int], list[str]] = {}
    for report in reports:
        for row in report["results"]:
            if row["distribution"] == distribution and "picked_backend" in row:
                picked.setdefault((row["divergence"], row["n_tokens"]), []).append(row["picked_backend"])
    return picked


def auto_lines(reports: list[dict[str, Any]], distribution: str) -> list[str]:
    """The note on ``band()``'s default backend in one distribution's block (over one run or several)."""
    picked = _picked(reports, distribution)
    return ["", auto_note(picked)] if picked else []


def first_call_intro(report: dict[str, Any]) -> str:
    """What the table of a user's first calls shows."""
    return (f"A user's first call: band(x, divergence, {report['delta']}) with its default backend, in a fresh "
            f"process (bandcore.band imported first, not counted), on `{report['distributions'][0]}` tokens, before "
            "anything of the divergence ran in the benchmark, small sizes first; the machine's kernel cache as found "
            "(a Numba kernel not in it is compiled). Later calls: the median of the next "
            "calls in the same process.")  # fmt: skip


def _first_call_lines(report: dict[str, Any]) -> list[str]:
    rows = report.get("first_calls") or []
    if not rows:
        return []
    lines = ["", first_call_intro(report), "", "| divergence | tokens | ran | first call | later calls | later ran |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for row in rows:
        cells = [row["divergence"], size_label(row["n_tokens"])]
        if "error" in row:
            cells += [row["error"], "", "", ""]
        else:
            cells += [row["backend"], f"{row['first_call_seconds']:.3g} s", f"{row['next_call_seconds'] * 1e3:.3g} ms",
                      row["next_backend"]]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def format_markdown(report: dict[str, Any]) -> str:
    """The Markdown tables (with the exact command line) of a JSON report; README's results are pasted from it."""
    sizes, threads, dtype = report["sizes"], report["threads"], baseline_dtype(report)
    lines = [f"Command: `{report['command']}`", ""]
    lines += [f"- {line}" for line in _header(report)]
    for distribution in report["distributions"]:
        lines += ["", f"### Distribution `{distribution}`: {report['generators'][distribution]}", ""]
        head = ["divergence", "method"]
        for n in sizes:
            tokens = size_label(n)
            head += [f"ns/token 1 thr ({tokens})", f"ns/token {threads} thr ({tokens})",
                     f"× exp pass 1 thr ({tokens})", f"× published {dtype} 1 / {threads} thr ({tokens})"]  # fmt: skip
        head += ["max error lower / upper", "contract"]
        lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
        for (divergence, method), per_size in by_row(report, distribution).items():
            first = next(iter(per_size.values()))
            cells = [divergence, label(report, method)]
            for n in sizes:
                row = per_size.get(n)
                if row is None:
                    cells += ["–"] * 4
                    continue
                one, every = versus_published(row, "1"), versus_published(row, "all")
                against = "–" if one[0] is None or row["kind"] == "unit" else (
                    f"{one[1]}{ratio(one[0])} / {ratio(every[0])}")  # fmt: skip
                cells += [ns(row["ns_per_token"]["1"]), ns(row["ns_per_token"]["all"]),
                          ratio(row["x_exp_pass"]["1"]), against]  # fmt: skip
            unit = first["kind"] == "unit"
            cells.append("" if unit else f"{_error(first['max_rel_err_lower'])} / {_error(first['max_rel_err_upper'])}")
            cells.append(_contract(first))
            lines.append("| " + " | ".join(cells) + " |")
        lines += auto_lines([report], distribution)
        lines += _nearest_lines(report, distribution)
    lines += _first_call_lines(report)
    if report["tables"]:
        lines += ["", "| table | origin | knots | certified max error |", "| --- | --- | --- | --- |"]
        for name, info in report["tables"].items():
            lines.append(f"| {name} | {info['origin']} | {info['knots']} | {info['certified_max_rel_error']:.1e} |")
    if report.get("memory"):
        lines += ["", "| peak memory (KL, llm) | tokens | extra MB | × input | × the two outputs |",
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
    """The plain-text table ``bandcore bench`` prints (one line per distribution, divergence, method and size)."""
    threads, dtype = report["threads"], baseline_dtype(report)
    lines = [f"bandcore bench: {report['command']}", *_header(report), ""]
    lines.append(
        f"{'dist':<4} {'divergence':<12} {'method':<14} {'tokens':>7} {'ns/tok 1t':>10} {f'ns/tok {threads}t':>10} "
        f"{'x exp 1t':>8} {f'x {dtype} 1t':>13} {f'x {dtype} {threads}t':>13} {'err lower':>10} {'err upper':>10} "
        f"{'1st call s':>10}"
    )
    for distribution in report["distributions"]:
        for (divergence, method), per_size in by_row(report, distribution).items():
            for n, row in per_size.items():
                one, every = versus_published(row, "1"), versus_published(row, "all")
                publ = [("-" if v is None or row["kind"] == "unit" else f"{tag}{v:.2f}") for v, tag in (one, every)]
                errors = ("", "") if row["kind"] == "unit" else (
                    _error(row["max_rel_err_lower"]), _error(row["max_rel_err_upper"]))  # fmt: skip
                lines.append(
                    f"{distribution:<4} {divergence:<12} {method:<14} {size_label(n):>7} "
                    f"{row['ns_per_token']['1']:10.2f} {row['ns_per_token']['all']:10.2f} "
                    f"{row['x_exp_pass']['1']:8.2f} {publ[0]:>13} {publ[1]:>13} {errors[0]:>10} {errors[1]:>10} "
                    f"{row['times']['1']['first_call_seconds']:10.3f}"
                )
                if "picked_backend" in row:
                    lines.append(f"     ran {row['picked_backend']} in the timed rounds")
                for key, near in (row.get("nearest_catalogue") or {}).items():
                    if near is not None:
                        lines.append(
                            f"     nearest in cost ({key} thr): {near['divergence']} ({near['transcendentals']} "
                            f"transcendentals), x {near['ratio']:.2f} its time"
                        )
    for row in report.get("first_calls") or []:
        what = row["error"] if "error" in row else (
            f"{row['backend']}, {row['first_call_seconds']:.3f} s; later calls {row['next_call_seconds'] * 1e3:.3g} ms "
            f"({row['next_backend']})")  # fmt: skip
        lines.append(f"first call, fresh process: {row['divergence']} {size_label(row['n_tokens'])}: {what}")
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
    seen = set()
    for row in report["results"]:
        if row["within_contract"] is False and (row["divergence"], row["method"]) not in seen:
            seen.add((row["divergence"], row["method"]))
            lines.append(f"ABOVE CONTRACT: {row['divergence']} {row['method']}: error {_error(row['max_rel_err'])} "
                         f"> {row['contract']:.1e}")  # fmt: skip
    return "\n".join(lines)

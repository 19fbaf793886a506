"""The benchmark report as text (the JSON report of :func:`bandcore.tools.bench.run_bench` is the source)."""

from __future__ import annotations

from typing import Any


def format_report(report: dict[str, Any]) -> str:
    """The human-readable table ``bandcore bench`` prints."""
    copy = report["copy"]
    lines = [
        f"bandcore bench: {report['n_tokens']:,} float32 log-probs, delta={report['delta']}, "
        f"best of {report['repeats']}, {report['machine']['cpu_count']} CPUs, threads {report['threads']} "
        f"(torch {report['machine']['torch_threads']}, numba {report['machine']['numba_threads']})",
        f"copy roofline: numpy {copy['numpy']['gb_per_s']:.2f} GB/s, torch {copy['torch']['gb_per_s']:.2f} GB/s "
        f"-> {copy['roofline_mtok_s']:.0f} Mtok/s at {copy['bytes_per_token']} B/token",
        f"accuracy: {report['accuracy_measure']} on {report['accuracy_points']} points",
        "",
        f"{'divergence':<10} {'method':<12} {'ms':>9} {'Mtok/s':>8} {'x publ.':>8} {'roofline':>8} "
        f"{'err lower':>10} {'err upper':>10} {'1st call s':>10}",
    ]
    for row in report["results"]:
        speedup = "-" if row["speedup_vs_published"] is None else f"{row['speedup_vs_published']:.1f}"
        lines.append(
            f"{row['divergence']:<10} {row['method']:<12} {row['seconds'] * 1e3:9.2f} {row['mtok_s']:8.2f} "
            f"{speedup:>8} {row['roofline_fraction']:8.1%} {row['max_rel_err_lower']:10.2e} "
            f"{row['max_rel_err_upper']:10.2e} {row['first_call_seconds']:10.3f}"
        )
    if report["tables"]:
        lines.append("")
        for name, info in report["tables"].items():
            lines.append(
                f"table {name}: {info['origin']} ({info['seconds']:.2f} s), {info['knots']} knots, "
                f"certified max rel error {info['certified_max_rel_error']:.2e}"
            )
    if report["memory"]:
        lines.append("")
        for row in report["memory"]:
            if "error" in row:
                lines.append(f"memory {row['method']:<6} {row['n_tokens']:>10,} tokens: {row['error']}")
            else:
                lines.append(
                    f"memory {row['method']:<6} {row['n_tokens']:>10,} tokens: "
                    f"peak +{row['peak_extra_bytes'] / 1e6:.1f} MB"
                    f" = {row['peak_over_input']:.2f} x input ({row['peak_over_outputs']:.2f} x the two outputs)"
                )
    for key, why in report["unavailable"].items():
        lines.append(f"unavailable {key}: {why}")
    return "\n".join(lines)

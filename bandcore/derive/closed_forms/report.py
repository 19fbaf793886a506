r"""Reports of a :class:`~bandcore.derive.Derivation`: Markdown with LaTeX (the packaged reports), plain text
(the terminal), and the index of the catalogue.

Everything printed is deterministic — no timings, no dates — so that a report regenerates byte for byte and
``bandcore derivations --check`` can compare it with the packaged copy.  The CVXPY verification line of a
report is computed by the caller (``bandcore.verify`` sits above this package) and passed in as text.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import sympy as sp

from ...divergences import Divergence
from ..generator_facts.mpmath_g import checked_facts
from ..generator_facts.symbolic import Facts
from .saturation import Saturation

if TYPE_CHECKING:  # pragma: no cover - the one direction: derivation calls report, report only names its type
    from .derivation import Derivation

__all__ = ["REPORT_DELTA", "VERIFIED_BEGIN", "VERIFIED_END", "index", "markdown", "slug", "text"]

#: δ at which the reports evaluate thresholds and numeric limits.
REPORT_DELTA = 0.05
#: The markers around a report's verification line.
VERIFIED_BEGIN, VERIFIED_END = "<!-- verified: begin -->", "<!-- verified: end -->"

_LIMIT_LABELS = {
    "upper_p0": (r"\lim_{p\to 0} r_{up}", "r_up (p → 0)"),
    "q_upper_p0": (r"\lim_{p\to 0} p\,r_{up}", "q_up = p·r_up (p → 0)"),
    "upper_p1": (r"\lim_{p\to 1} r_{up}", "r_up (p → 1)"),
    "lower_p0": (r"\lim_{p\to 0} r_{lo}", "r_lo (p → 0)"),
    "lower_p1": (r"\lim_{p\to 1} r_{lo}", "r_lo (p → 1)"),
}


def _tex(expr: sp.Expr) -> str:
    return sp.latex(expr, ln_notation=True)


def _number(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.10g}"


def _threshold_tex(sat: Saturation) -> str:
    word = r"p \ge" if sat.side == "upper" else r"p \le"
    edge = "1/p" if sat.side == "upper" else "0"
    if sat.never:
        return f"never (the bound never reaches ${edge}$)"
    if sat.threshold is not None:
        shown = f"${word} {_tex(sat.threshold)}$"
    elif sat.boundary is not None:
        shown = f"${word} p^*(\\delta)$ with $G(p^*) = \\delta$, $G(p) = {_tex(sat.boundary)}$ (numeric)"
    else:
        shown = f"${word} p^*(\\delta)$ with $G(p^*) = \\delta$ (numeric)"
    if sat.level != sp.oo:
        shown += f" for $\\delta < {_tex(sat.level)}$; every $p$ once $\\delta \\ge {_tex(sat.level)}$"
    return shown


def _threshold_text(sat: Saturation, delta: float) -> str:
    word = "p ≥" if sat.side == "upper" else "p ≤"
    if sat.never:
        return "never"
    formula = sp.sstr(sat.threshold) if sat.threshold is not None else "numeric"
    return f"{word} {_number(sat(delta))}  ({formula})"


def _limit_cells(d: Derivation, key: str, delta: float) -> tuple[str, str]:
    if key in d.limits:
        return f"${_tex(d.limits[key])}$", sp.sstr(d.limits[key])
    try:
        value = _number(d.limit_value(key, delta))
    except ValueError:
        return "not derived", "not derived"
    return f"{value} at $\\delta = {delta:g}$ (numeric)", f"{value} (numeric, δ = {delta:g})"


def _series_parts(d: Derivation) -> tuple[str, str] | None:
    t, a2, a3 = d.series
    if t is sp.nan or t.has(sp.nan):
        return None
    if _facts(d).is_smooth_at_one:
        tex = (
            r"r = 1 + t + a_2 t^2 + a_3 t^3 + O(t^4),\quad t = \pm " + _tex(t)
            + rf",\quad a_2 = {_tex(a2)},\quad a_3 = {_tex(a3)}"
        )
        shown = f"r = 1 + t + a2 t² + a3 t³ + O(t⁴),  t = ±{sp.sstr(t)},  a2 = {sp.sstr(a2)},  a3 = {sp.sstr(a3)}"
        return tex, shown
    if a2 == 0 and a3 == 0:
        return rf"r = 1 \pm {_tex(t)}\ \text{{(exact)}}", f"r = 1 ± {sp.sstr(t)}  (exact)"
    return rf"r = 1 \pm {_tex(t)} + O(\delta^2)", f"r = 1 ± {sp.sstr(t)} + O(δ²)"


def _closed_form_reason(d: Derivation, side: str) -> str:
    for note in d.notes:
        if note.startswith(f"{side} bound: no closed form"):
            return note.split("no closed form — ", 1)[-1]
    return "SymPy found no valid branch"


def _facts(d: Derivation) -> Facts:
    return d.facts if d.facts is not None else checked_facts(d.divergence)


def _one_sided_rows(fx: Facts) -> list[str]:
    """Table rows of the one-sided derivatives at 1, when the sides differ (a kink, or |u - 1|^a, a < 2)."""
    if fx.one_sided is None or fx.one_sided[0] == fx.one_sided[1]:
        return []
    rows = []
    for sign, values in zip("-+", fx.one_sided, strict=True):
        shown = ",\\ ".join(_tex(v) for v in values)
        rows.append(f"| $f'(1{sign}),\\ f''(1{sign}),\\ f'''(1{sign}),\\ f''''(1{sign})$ | ${shown}$ |")
    return rows


def _one_sided_text(fx: Facts) -> list[str]:
    """The same, for the terminal."""
    if fx.one_sided is None or fx.one_sided[0] == fx.one_sided[1]:
        return []
    return [
        f"  f'(1{sign}), f''(1{sign}), f'''(1{sign}), f''''(1{sign}) = {', '.join(sp.sstr(v) for v in values)}"
        for sign, values in zip("-+", fx.one_sided, strict=True)
    ]


def markdown(d: Derivation, verified_line: str | None = None) -> str:
    """The Markdown report of ``d`` (LaTeX formulas); ``verified_line`` goes between the verified markers."""
    div, fx = d.divergence, _facts(d)
    f2, f3, f4 = fx.derivatives_at_one
    out = [f"# The Band of `{div.name}`", ""]
    if div.convention or div.reference:
        out += [" — ".join(x for x in (div.convention, div.reference) if x), ""]
    out += [
        "## Generator",
        "",
        "| quantity | value |",
        "| --- | --- |",
        f"| $f(u)$ | ${_tex(fx.f)}$ |",
        f"| $\\tilde f(u) = f(u) - f'(1)(u - 1)$ | ${_tex(d.f_normalised)}$ |",
        f"| $f''(1),\\ f'''(1),\\ f''''(1)$ | ${_tex(f2)},\\ {_tex(f3)},\\ {_tex(f4)}$ |",
        *_one_sided_rows(fx),
        f"| $\\tilde f(0^+)$ | ${_tex(fx.f_at_zero)}$ |",
        f"| $\\lim_{{u\\to\\infty}} \\tilde f(u)/u$ | ${_tex(fx.slope_at_infinity)}$ |",
        "",
        "## Binary reduction",
        "",
        "With $s = (1 - p r)/(1 - p)$ (the other tokens keep their old proportions), the token's ratio $r$ is in",
        "the Band iff $g_f(p, r) = p\\,\\tilde f(r) + (1-p)\\,\\tilde f(s) \\le \\delta$, where",
        "",
        f"$$g_f(p, r) = {_tex(d.g)}$$",
        "",
        "## Closed forms",
        "",
        "Valid wherever that side is not saturated (see below); every branch was validated numerically.",
        "",
    ]
    for side, expr in (("upper", d.upper), ("lower", d.lower)):
        name = "r_{up}" if side == "upper" else "r_{lo}"
        if expr is None:
            out += [f"- ${name}$: **none** — {_closed_form_reason(d, side)}", ""]
        else:
            out += [f"- ${name}(p, \\delta)$:", "", f"$${_tex(expr)}$$", ""]
    out += [
        "## Saturation",
        "",
        f"- upper bound $= 1/p$ iff {_threshold_tex(d.saturation_upper)}",
        f"- lower bound $= 0$ iff {_threshold_tex(d.saturation_lower)}",
        f"- at $\\delta = {REPORT_DELTA:g}$: upper saturates for $p \\ge$ "
        f"{_number(d.saturation_upper(REPORT_DELTA))}, lower for $p \\le$ "
        f"{_number(d.saturation_lower(REPORT_DELTA))}",
        "",
        "## Limits at fixed δ",
        "",
        "For δ below the level at which a side saturates for every $p$ (if any, see above).",
        "",
        "| limit | value |",
        "| --- | --- |",
    ]
    for key, (label, _) in _LIMIT_LABELS.items():
        out.append(f"| ${label}$ | {_limit_cells(d, key, REPORT_DELTA)[0]} |")
    out += ["", "## Small-δ series", ""]
    series = _series_parts(d)
    out += [f"$${series[0]}$$" if series else "not derived (see the notes)", ""]
    out += ["## Notes", ""] + [f"- {note}" for note in d.notes] + [""]
    out += ["## Verification", "", VERIFIED_BEGIN]
    if verified_line:
        out.append(verified_line)
    out += [VERIFIED_END, "", "Generated by `bandcore derivations`; do not edit by hand.", ""]
    return "\n".join(out)


def text(d: Derivation, delta: float) -> str:
    """The plain-text report of ``d`` for a terminal, with numbers evaluated at ``delta``."""
    div, fx = d.divergence, _facts(d)
    f2, f3, f4 = fx.derivatives_at_one
    lines = [
        f"Band of {div.name}:  f(u) = {sp.sstr(fx.f)}",
        *([f"  {div.convention}"] if div.convention else []),
        f"  normalised f̃(u) = {sp.sstr(d.f_normalised)}",
        f"  f''(1) = {sp.sstr(f2)},  f'''(1) = {sp.sstr(f3)},  f''''(1) = {sp.sstr(f4)},  "
        f"f̃(0) = {sp.sstr(fx.f_at_zero)}",
        *_one_sided_text(fx),
        f"  g_f(p, r) = {sp.sstr(d.g)}",
        "",
        "closed forms (valid where not saturated):",
    ]
    for side, expr in (("upper", d.upper), ("lower", d.lower)):
        shown = sp.sstr(expr) if expr is not None else f"none — {_closed_form_reason(d, side)}"
        lines.append(f"  r_{side[:2]} = {shown}")
    lines += [
        "",
        f"saturation (threshold at δ = {delta:g}):",
        f"  upper = 1/p iff {_threshold_text(d.saturation_upper, delta)}",
        f"  lower = 0   iff {_threshold_text(d.saturation_lower, delta)}",
        "",
        "limits at fixed δ:",
    ]
    for key, (_, label) in _LIMIT_LABELS.items():
        lines.append(f"  {label:<22} {_limit_cells(d, key, delta)[1]}")
    series = _series_parts(d)
    lines += ["", "small-δ series:", f"  {series[1] if series else 'not derived (see notes)'}", "", "notes:"]
    lines += [f"  - {note}" for note in d.notes]
    return "\n".join(lines)


def slug(div: Divergence) -> str:
    """File name stem of a report: ``alpha(-1)`` → ``alpha_m1``, ``alpha(0.5)`` → ``alpha_0.5``; any other
    character outside ``[A-Za-z0-9._]`` becomes ``_`` (a formula never makes a path)."""
    stem = div.name.replace("(", "_").replace(")", "").replace("-", "m")
    stem = re.sub(r"[^A-Za-z0-9._]", "_", stem).lstrip(".")
    return stem or "divergence"


def _index_threshold(sat: Saturation) -> str:
    if sat.never:
        return "never"
    word = r"p \ge" if sat.side == "upper" else r"p \le"
    every = "" if sat.level == sp.oo else f"; every $p$ once $\\delta \\ge {_tex(sat.level)}$"
    if sat.threshold is not None:
        return f"${word} {_tex(sat.threshold)}${every}"
    return f"numeric (${word}$ {_number(sat(REPORT_DELTA))} at $\\delta = {REPORT_DELTA:g}$){every}"


def index(derivations: list[Derivation]) -> str:
    """The ``README.md`` of the reports: one row per derivation."""
    out = [
        "# Derivations of the Band",
        "",
        "One report per catalogue divergence, generated by `bandcore.derive` (SymPy) — the binary reduction",
        "$g_f(p, r)$, closed-form bounds (every branch validated numerically against a bracketed root),",
        "saturation thresholds, limits and the small-δ series. The reports are installed with the package",
        "(`bandcore/derive/reports/`); a source checkout keeps a copy in `derivations/`. Do not edit them by hand:",
        "",
        "```bash",
        "bandcore derivations --update  # rewrite the packaged reports (and derivations/ in a source checkout)",
        "bandcore derivations --check   # exit 1 if any report differs from what the code derives (a test runs this)",
        "bandcore derivations --out DIR # write a copy into DIR",
        "```",
        "",
        "The upper bound is $1/p$ iff $p \\ge$ the upper threshold; the lower bound is $0$ iff $p \\le$ the lower",
        "threshold. Limits are at fixed δ (below the level at which a side saturates for every p).",
        "",
        "| divergence | $f(u)$ | closed form $r_{up}$ / $r_{lo}$ | upper saturates iff | lower saturates iff "
        "| $\\lim_{p\\to0} p\\,r_{up}$ | $\\lim_{p\\to1} r_{lo}$ | $f''(1)$ |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in derivations:
        div = d.divergence
        closed = " / ".join("yes" if e is not None else "no" for e in (d.upper, d.lower))
        cells = [
            f"[`{div.name}`]({slug(div)}.md)",
            f"${_tex(_facts(d).f)}$",
            closed,
            _index_threshold(d.saturation_upper),
            _index_threshold(d.saturation_lower),
            _limit_cells(d, "q_upper_p0", REPORT_DELTA)[0],
            _limit_cells(d, "lower_p1", REPORT_DELTA)[0],
            f"${_tex(d.f2)}$",
        ]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return "\n".join(out)

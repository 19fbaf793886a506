"""CVXPY global optimality of the Band (bandcore.verify) and the generator → DCP mapping (bandcore.verify.dcp)."""

import math

import cvxpy as cp
import numpy as np
import pytest

import bandcore as bc
from bandcore.cli import main
from bandcore.derive.generator_facts.symbolic import U, facts
from bandcore.divergences import Divergence, resolve
from bandcore.verify import NotDCPError, VerificationReport, VerificationRow, dcp_generator, summary_line, verify

CATALOGUE = bc.list_divergences()
ALPHAS = (3.0, 2.0, 0.5, 1 / 3, -1.0, -2.0, 0.0, 1.0, 1.5)
USER_DCP = [
    "(u-1)**4",
    "exp(u)-E*u",
    "exp(u-1)-u",
    "(u-1)*log(u)",
    "abs(u-1)+(u-1)**2",
    "sqrt(2)*(u-1)**2",
    "u**1.7 - 1 - 1.7*(u-1)",
    "2*(u-1)**2/(u+1)",
    "u*log(u)+(u+1)*log(u+1)-2*log(2)*u - (2*log(2)+1)*(u-1)",
]


SPELLINGS = [*CATALOGUE, *(("alpha", a) for a in ALPHAS), *USER_DCP]


def _resolve(spelling):
    return bc.get_divergence("alpha", alpha=spelling[1]) if isinstance(spelling, tuple) else resolve(spelling)


@pytest.mark.parametrize("spelling", SPELLINGS, ids=str)
def test_dcp_expression_is_convex_and_equals_the_generator(spelling):
    div = _resolve(spelling)
    u = cp.Variable(5, nonneg=True)
    expression = dcp_generator(div)(u)
    assert expression.is_convex()
    u.value = np.array([1e-3, 0.3, 1.0, 2.5, 40.0])
    expected = [float(facts(div).f.subs(U, x)) for x in u.value]
    np.testing.assert_allclose(expression.value, expected, rtol=1e-12, atol=1e-12)


def test_js_uses_the_mixture_entropy_form():
    u = cp.Variable(2, nonneg=True)
    atoms = {a.__name__ for a in dcp_generator(bc.get_divergence("js"))(u).atoms()}
    assert "rel_entr" in atoms


@pytest.mark.parametrize(
    "text, term",
    [("sqrt(u**2+1) - sqrt(2) - (u-1)/sqrt(2)", "sqrt(u**2 + 1)"), ("(u-1)**4/(u+1)", "-5*u**2")],
)
def test_non_dcp_generator_is_refused_by_name(text, term):
    div = Divergence.from_expression(text, name="mine")
    with pytest.raises(NotDCPError, match="not DCP-representable") as info:
        verify(div, 0.05, n=(2,), p=(0.5,))
    assert "'mine'" in str(info.value) and term in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("name", CATALOGUE)
def test_catalogue_agrees_with_the_band_at_small_n(name):
    report = verify(name, 0.05, n=(2, 10), p=(0.08, 0.5))
    assert report.passed, report.summary()
    assert report.max_error <= 1e-6
    assert report.cross_check_passed, report.summary()
    assert len(report.rows) == 2 * 2 * 2
    assert all(row.cross_status for row in report.rows)


@pytest.mark.parametrize("text", ["alpha(0.5)", "alpha(-1)", "(u-1)**4", "exp(u-1)-u"])
def test_parameterised_and_user_divergences_verify(text):
    report = verify(text, (0.01, 0.2), n=(2, 10), p=(0.08, 0.5), cross_check=None)
    assert report.divergence == resolve(text).name
    assert report.passed, report.summary()


def test_tv_skips_proportionality_and_saturation_is_found():
    report = verify("tv", 0.05, n=(10,), p=(0.001, 0.5, 0.99), cross_check=None)
    assert report.passed, report.summary()
    assert all(math.isnan(row.spread) for row in report.rows)
    by_key = {(row.p, row.side): row for row in report.rows}
    assert by_key[(0.001, "lower")].band == 0.0 and abs(by_key[(0.001, "lower")].value) < 1e-8
    assert by_key[(0.99, "upper")].band == pytest.approx(1 / 0.99, rel=1e-15)


def test_report_renders_a_table_and_a_summary():
    report = verify("kl", 0.05, n=(2,), p=(0.5,), cross_check=None)
    text = str(report)
    assert text.startswith("| n | p | δ | side | Band | CLARABEL |")
    assert text.count("\n| 2 | 0.5 | 0.05 |") == 2
    assert "kl: PASSED" in report.summary()
    assert set(report.times) == {2} and report.statuses


def test_a_disagreement_fails_the_report():
    report = verify("kl", 0.05, n=(2,), p=(0.5,), cross_check=None, tolerance=1e-300)
    assert not report.passed and "FAILED" in report.summary()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(delta=-1.0), "delta"),
        (dict(delta=0.05, n=(1,)), "n must"),
        (dict(delta=0.05, p=(1.5,)), "p must"),
        (dict(delta=0.05, solver="NOPE"), "solver 'NOPE'"),
        (dict(delta=0.05, tolerance=0.0), "tolerance"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        verify("kl", **kwargs)


def test_cli_exit_codes(capsys):
    assert main(["verify", "kl", "hellinger", "--n", "2", "--p", "0.5", "--delta", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "2/2 divergences verified" in out and "| 2 | 0.5 | 0.05 | lower |" in out
    assert main(["verify", "kl", "--n", "2", "--p", "0.5", "--tolerance", "1e-300", "--summary"]) == 1
    assert "FAILED" in capsys.readouterr().out
    assert main(["verify", "sqrt(u**2+1) - sqrt(2) - (u-1)/sqrt(2)", "--n", "2"]) == 2
    assert "not DCP-representable" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name", CATALOGUE)
def test_done_criterion_every_catalogue_divergence_at_n_up_to_1000(name):
    """The issue's 'done when': agreement <= 1e-6 at δ ∈ {0.01, 0.05, 0.2}, n ∈ {2, 10, 100, 1000}."""
    report = verify(name, (0.01, 0.05, 0.2), cross_check=None)
    assert report.passed, report.summary()
    assert {row.n for row in report.rows} == {2, 10, 100, 1000}


@pytest.mark.slow
def test_summary_line_is_deterministic():
    first, second = summary_line("hellinger"), summary_line("hellinger")
    assert first == second
    assert first.startswith("Verified: CVXPY (Clarabel) optimum over the full simplex agrees with the Band to ≤ 1e-")
    assert "n ∈ {2, 10, 1000}" in first and "δ ∈ {0.01, 0.05, 0.2}" in first


def test_band_values_are_roots_of_g():
    """The mpmath g_f of bandcore.derive checks the Band's own values: a disagreement can be told apart."""
    report = verify("hellinger", (0.05, 0.5), n=(2,), p=(0.001, 0.5, 0.99), cross_check=None)
    assert report.max_residual <= 1e-9
    assert all(not math.isnan(row.residual) for row in report.rows)
    assert "Band root residual" in report.summary()


def test_report_classes_are_exported_without_cvxpy_objects():
    row = VerificationRow("kl", 2, 0.5, 0.05, "upper", 1.3, 1.3, 0.0, math.nan, "optimal", 0.01)
    report = VerificationReport("kl", [row], 1e-6, "CLARABEL", "", 0.0)
    assert report.passed and math.isnan(report.max_residual) and "kl: PASSED" in report.summary()


def test_cli_usage_errors_and_progress_quiet(capsys):
    assert main(["verify", "klx", "--n", "2"]) == 2
    assert "unknown divergence 'klx'" in capsys.readouterr().err
    assert main(["verify", "kl", "--delta", "nan"]) == 2
    assert "--delta values must be finite and > 0" in capsys.readouterr().err
    assert main(["verify", "kl", "--p", "1.0"]) == 2
    assert main(["verify", "kl", "--n", "1"]) == 2
    assert main(["verify", "(u-1", "--n", "2"]) == 2
    assert "neither a catalogue name" in capsys.readouterr().err
    assert main(["verify", "alpha(0.5)", "(u-1)**4", "--n", "2", "--p", "0.5", "--summary", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "2/2 divergences verified" in out and "alpha(0.5): PASSED" in out

"""`bandcore list`, `bandcore derive`, `bandcore derivations` through bandcore.cli.main."""

from __future__ import annotations

import importlib

import pytest

from bandcore.cli import main

derive_module = importlib.import_module("bandcore.derive")  # the module: the attribute bandcore.derive is the function


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for piece in ("kl", "bandkl", "-log(u)", "KL(π_old‖π)", "bandtv", "bandchi2", "alpha (alpha=A, default 3)"):
        assert piece in out


def test_derive_name(capsys):
    assert main(["derive", "bandchi2", "--delta", "0.1"]) == 0
    out = capsys.readouterr().out
    assert "Band of pearson" in out
    assert "r_up = sqrt(delta)*sqrt(1 - p)/sqrt(p) + 1" in out
    assert "upper = 1/p iff p ≥ 0.9090909091" in out  # 1/(1 + δ) at δ = 0.1


def test_derive_expression_shows_the_square_root_closed_form(capsys, tmp_path):
    report = tmp_path / "square.md"
    assert main(["derive", "(u-1)**2", "--markdown", str(report)]) == 0
    out = capsys.readouterr().out
    assert "r_up = sqrt(delta)*sqrt(1 - p)/sqrt(p) + 1" in out
    assert "r_lo = -sqrt(delta)*sqrt(1 - p)/sqrt(p) + 1" in out
    text = report.read_text(encoding="utf-8")
    assert text.startswith("# The Band of `(u-1)**2`") and "\\sqrt{\\delta}" in text


def test_derive_alpha_member(capsys):
    assert main(["derive", "alpha(2)"]) == 0
    assert "Band of alpha(2)" in capsys.readouterr().out


def test_derive_kl_says_none(capsys):
    assert main(["derive", "kl"]) == 0
    out = capsys.readouterr().out
    assert "r_up = none — the equation is transcendental in r" in out


@pytest.mark.parametrize(
    "attack", ["__import__('os').system('echo hacked')", "u.__class__", "open('x', 'w')", "(lambda: 1)()"]
)
def test_derive_malicious_string(capsys, attack):
    assert main(["derive", attack]) == 2
    captured = capsys.readouterr()
    assert "hacked" not in captured.out
    assert "bandcore derive: error: divergence" in captured.err
    assert "is neither a catalogue name" in captured.err and "not allowed" in captured.err


def test_derive_invalid_generator(capsys):
    assert main(["derive", "log(u)"]) == 2
    assert "f is not convex" in capsys.readouterr().err


def test_derive_bad_delta(capsys):
    assert main(["derive", "kl", "--delta", "-1"]) == 2
    assert "--delta must be a finite number > 0, got -1.0" in capsys.readouterr().err


def test_derive_catalogue_table(capsys):
    assert main(["derive"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["divergence", "closed"]
    assert len(lines) == 2 + 12
    kl = next(line for line in lines if line.startswith("kl "))
    assert "[0.691516, 1.30848]" in kl and "[0.261696, 2.41055]" in kl  # MATH.md §4 reference values
    hellinger = next(line for line in lines if line.startswith("hellinger "))
    assert "yes/yes" in hellinger and "[0.0490475, 2.98783]" in hellinger


def test_derivations_check_detects_stale_files(tmp_path, capsys, monkeypatch):
    # the CVXPY "Verified" line is exercised by the real check below; here only the file comparison matters
    monkeypatch.setattr(derive_module, "_verified_line", lambda div: None)
    assert main(["derivations", "--dir", str(tmp_path)]) == 0
    assert main(["derivations", "--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "kl.md").write_text("stale\n", encoding="utf-8")
    (tmp_path / "tv.md").unlink()
    assert main(["derivations", "--check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "kl.md" in err and "tv.md" in err and "run `bandcore derivations`" in err


@pytest.mark.slow
def test_derivations_in_the_repository_are_up_to_date(capsys):
    """The shipped derivations/ match what the code derives now (including bandcore.verify's line)."""
    assert main(["derivations", "--check"]) == 0, capsys.readouterr().err

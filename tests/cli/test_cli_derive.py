"""`bandcore list`, `bandcore derive`, `bandcore derivations` through bandcore.cli.main."""

from __future__ import annotations

from pathlib import Path

import pytest

from bandcore.cli import derive as cli_derive
from bandcore.cli import main
from bandcore.derive import catalogue
from bandcore.derive.closed_forms.files import packaged_reports, source_tree_directory


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
    assert text.startswith("# The Band of `(u - 1)**2`") and "\\sqrt{\\delta}" in text  # the canonical spelling
    assert "<!-- verified: begin -->\n<!-- verified: end -->" in text  # no --verify: no CVXPY line


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
    assert len(lines) == 2 + len(catalogue())  # a header, a rule, one row per divergence
    kl = next(line for line in lines if line.startswith("kl "))
    assert "[0.691516, 1.30848]" in kl and "[0.261696, 2.41055]" in kl  # independent reference values
    hellinger = next(line for line in lines if line.startswith("hellinger "))
    assert "yes/yes" in hellinger and "[0.0490475, 2.98783]" in hellinger


def test_derive_usage_errors_exit_2(capsys):
    assert main(["derive", "klx"]) == 2
    assert "unknown divergence 'klx'" in capsys.readouterr().err
    assert main(["derive", "kl", "--delta", "nan"]) == 2
    assert "--delta must be a finite number > 0, got nan" in capsys.readouterr().err
    assert main(["derive", "(u-1"]) == 2
    assert "not a valid expression" in capsys.readouterr().err


def test_derive_formula_spellings_resolve_everywhere(capsys):
    assert main(["derive", "alpha(0.5)", "--delta", "0.1"]) == 0
    assert "Band of alpha(0.5)" in capsys.readouterr().out
    assert main(["derive", "(sqrt(u) - 1)**2"]) == 0  # a formula that happens to be Hellinger's
    assert "r_up = " in capsys.readouterr().out


def test_derive_markdown_with_the_verification_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli_derive, "_verified_line", lambda div, progress=None: f"Verified: {div.name} (stub)")
    report = tmp_path / "tv.md"
    assert main(["derive", "bandtv", "--markdown", str(report), "--verify"]) == 0
    assert "<!-- verified: begin -->\nVerified: tv (stub)\n<!-- verified: end -->" in report.read_text("utf-8")
    assert main(["derive", "tv", "--markdown", str(tmp_path / "missing" / "tv.md")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_derivations_check_detects_stale_files(tmp_path, capsys, monkeypatch):
    # the CVXPY line itself is exercised by the slow check below; here a stub keeps it fast
    monkeypatch.setattr(cli_derive, "_verified_line", lambda div, progress=None: f"Verified: {div.name} (stub)")
    assert main(["derivations", "--dir", str(tmp_path)]) == 0
    assert "Verified: kl (stub)" in (tmp_path / "kl.md").read_text(encoding="utf-8")
    assert main(["derivations", "--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "kl.md").write_text("stale\n", encoding="utf-8")
    (tmp_path / "tv.md").unlink()
    assert main(["derivations", "--check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "kl.md" in err and "tv.md" in err and "run `bandcore derivations" in err
    assert err.count("\n") == 1  # one line


def test_derivations_never_replace_a_differing_file_without_force(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli_derive, "_verified_line", lambda div, progress=None: None)
    mine = tmp_path / "kl.md"
    mine.write_text("my notes\n", encoding="utf-8")
    assert main(["derivations", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "kl.md" in err and "--force" in err and err.count("\n") == 1
    assert mine.read_text(encoding="utf-8") == "my notes\n"
    assert not (tmp_path / "tv.md").exists()  # nothing written at all
    assert main(["derivations", "--out", str(tmp_path), "--force"]) == 0
    assert mine.read_text(encoding="utf-8").startswith("# The Band of `kl`")
    assert main(["derivations", "--out", str(tmp_path)]) == 0  # identical now: nothing to refuse
    assert "wrote 0 of 13 reports" in capsys.readouterr().out


def test_derivations_usage_errors(capsys):
    assert main(["derivations", "--check", "--update"]) == 2
    assert main(["derivations", "--update", "--out", "x"]) == 2
    assert "--update" in capsys.readouterr().err


def test_packaged_reports_match_the_code_apart_from_the_cvxpy_lines(capsys):
    """The installed reports (and derivations/ of a checkout) are what the code derives now."""
    assert set(packaged_reports()) >= {"README.md", "kl.md", "alpha_0.5.md", "alpha_m1.md"}
    assert main(["derivations", "--check", "--no-verify"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "the packaged reports" in out and "all 13 reports up to date" in out


def test_source_tree_copy_is_found_only_next_to_the_package():
    folder = source_tree_directory()
    if folder is not None:
        assert folder.name == "derivations" and (folder.parent / "pyproject.toml").is_file()
        assert Path(cli_derive.__file__).resolve().parents[2] == folder.parent


@pytest.mark.slow
def test_derivations_in_the_repository_are_up_to_date(capsys):
    """The packaged reports match what the code derives now (including bandcore.verify's line)."""
    assert main(["derivations", "--check"]) == 0, capsys.readouterr().err

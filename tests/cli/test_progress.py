"""Progress bars: on a terminal (a pseudo-terminal here) they appear on stderr with their total; with ``--quiet``
or when stderr is not a terminal nothing is written to stderr.  The helper is ``bandcore._progress``."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import tempfile
import termios

import pytest

from bandcore._progress import progress, progress_enabled
from bandcore.cli import main
from bandcore.derive import catalogue

_MAIN = "import sys; from bandcore.cli import main; sys.exit(main())"


def _on_terminal(args: list[str], timeout: float = 600) -> tuple[int, str, str]:
    """Run ``bandcore ARGS`` with stderr on a pseudo-terminal (120 columns): (exit code, stderr, stdout)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, "-c", _MAIN, *args], stdin=subprocess.DEVNULL, stdout=out,
                                stderr=slave)  # fmt: skip
        os.close(slave)
        chunks = []
        try:
            while select.select([master], [], [], timeout)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
        finally:
            os.close(master)
            returncode = proc.wait(timeout=timeout)
        out.seek(0)
        return returncode, b"".join(chunks).decode("utf-8", "replace"), out.read().decode("utf-8", "replace")


def test_enabled_follows_the_flag_then_the_terminal():
    assert progress_enabled(True) is True and progress_enabled(False) is False
    assert progress_enabled(None) is sys.stderr.isatty()  # pytest captures stderr: not a terminal


def test_disabled_bar_is_silent_and_keeps_the_items(capsys):
    with progress(iter([1, 2, 3]), total=3, desc="x", enabled=False) as bar:
        assert list(bar) == [1, 2, 3]
        bar.update(5)
        bar.set_postfix_str("ignored")
        bar.write("above the bar")
    with progress(total=4, desc="y") as bar:  # enabled=None and stderr is not a terminal
        bar.update(4)
        assert list(bar) == []
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == "above the bar\n"


def test_enabled_bar_draws_its_total_on_stderr(capsys):
    with progress(range(3), desc="drawn", unit="thing", enabled=True) as bar:
        assert list(bar) == [0, 1, 2]
        bar.write("between")
    captured = capsys.readouterr()
    assert "drawn:" in captured.err and "/3" in captured.err and "thing" in captured.err
    assert "between" in captured.out and "drawn" not in captured.out


VERIFY = ["verify", "tv", "--n", "2", "--p", "0.5", "--cross-check", "none", "--summary"]


def test_verify_bar_on_a_terminal_and_quiet_options():
    code, err, out = _on_terminal(VERIFY)
    assert code == 0 and "1/1 divergences verified" in out
    assert "verify:" in err and "0/2" in err and "2/2" in err  # 2 programs: both sides at one n, p, δ
    code, err, out = _on_terminal([*VERIFY, "--quiet"])
    assert code == 0 and err == "" and "1/1 divergences verified" in out


def test_derive_bar_counts_the_steps_on_a_terminal():
    code, err, out = _on_terminal(["derive", "tv"])
    assert code == 0 and "Band of" in out
    assert "derive" in err and "/6" in err  # the six steps of bandcore.derive.closed_forms.derivation.STEPS
    code, err, _ = _on_terminal(["derive", "tv", "--quiet"])
    assert code == 0 and err == ""


def test_no_terminal_means_no_bar(capsys):
    assert main(VERIFY) == 0
    assert main(["derive", "tv"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "1/1 divergences verified" in captured.out


@pytest.mark.slow
def test_bench_and_derivations_bars_on_a_terminal(tmp_path):
    bench = ["bench", "--quick", "--no-memory", "--divergences", "tv", "--n", "500"]
    code, err, out = _on_terminal(bench)
    assert code == 0 and "tv " in out
    # 1 (header) + 1 (a user's first call, 1 size) + 1 (oracle, tables) + 8 methods (published on float32 and on
    # float64, band()'s default, 3 forced backends, 2 table paths) x 1 size x 3 distributions
    assert "bench:" in err and "/27" in err
    code, err, _ = _on_terminal([*bench, "--quiet"])
    assert code == 0 and err == ""
    code, err, out = _on_terminal(["derivations", "--no-verify", "--out", str(tmp_path)])
    reported = len(catalogue())  # one report per divergence of the derivation catalogue, and README.md
    assert code == 0 and f"wrote {reported + 1} of {reported + 1} reports" in out
    assert "derivations:" in err and f"/{reported}" in err


def test_table_build_bar_only_on_a_terminal(tmp_path, capsys):
    out = tmp_path / "tv.npz"
    assert main(["table", "build", "--divergence", "tv", "--delta", "0.3", "--out", str(out)]) == 0
    assert capsys.readouterr().err == ""  # no --quiet, but stderr is not a terminal
    code, err, _ = _on_terminal(["table", "build", "--divergence", "tv", "--delta", "0.3", "--out", str(out)])
    assert code == 0 and "table tv" in err
    code, err, _ = _on_terminal(["table", "build", "--divergence", "tv", "--delta", "0.3", "--out", str(out),
                                 "--quiet"])  # fmt: skip
    assert code == 0 and err == ""

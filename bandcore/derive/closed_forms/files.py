"""The report files: render them, compare them with a copy, write them.

The reports of :func:`~bandcore.derive.catalogue` are installed with the package (``bandcore/derive/reports/``,
read with :mod:`importlib.resources`); a source checkout also keeps a copy in ``derivations/`` for browsing.
Nothing here depends on the source tree: :func:`source_tree_directory` finds that copy only when it exists.
Writing never touches a file outside the target folder, and never replaces a file that differs unless asked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib import resources
from pathlib import Path

from ..._progress import progress as progress_bar
from ...divergences import Divergence
from .derivation import _derive, catalogue
from .report import VERIFIED_BEGIN, VERIFIED_END, index, slug

__all__ = [
    "check_directory",
    "packaged_directory",
    "packaged_reports",
    "render_derivations",
    "source_tree_directory",
    "stale_reports",
    "write_derivations",
]

_PACKAGE = "bandcore.derive"
_FOLDER = "reports"


def render_derivations(
    divergences: Iterable[Divergence] | None = None,
    *,
    verified_line: Callable[[Divergence], str | None] | None = None,
    progress: bool | None = None,
) -> dict[str, str]:
    """File name → content of every report (default: :func:`~bandcore.derive.catalogue`) and the ``README.md``.

    Parameters
    ----------
    divergences : iterable of Divergence, optional
        What to report on (default: the catalogue of the packaged reports).
    verified_line : callable, optional
        ``divergence -> str`` placed in each report's verification section (``bandcore.verify.summary_line``);
        without it that section stays empty.
    progress : bool or None
        A bar over the divergences (derivation and verification line) on stderr; ``None`` draws it when stderr
        is a terminal, ``False`` never.
    """
    chosen = list(catalogue() if divergences is None else divergences)
    derivations, lines = [], []
    with progress_bar(chosen, desc="derivations", unit="divergence", enabled=progress) as bar:
        for div in bar:
            bar.set_postfix_str(div.name)
            derivations.append(_derive(div))
            lines.append(verified_line(div) if verified_line else None)
    files = {
        f"{slug(d.divergence)}.md": d.to_markdown(verified_line=line)
        for d, line in zip(derivations, lines, strict=True)
    }
    files["README.md"] = index(derivations)
    return files


def _strip_verified(content: str) -> str:
    """``content`` with the text between the verified markers removed."""
    start, end = content.find(VERIFIED_BEGIN), content.find(VERIFIED_END)
    if start < 0 or end < start:
        return content
    return content[: start + len(VERIFIED_BEGIN)] + "\n" + content[end:]


def stale_reports(
    expected: Mapping[str, str], actual: Mapping[str, str], *, ignore_verified: bool = False, exact: bool = False
) -> list[str]:
    """Names of the reports missing from ``actual`` or differing from ``expected`` (sorted).

    ``ignore_verified`` compares without the verification lines; ``exact`` also lists ``.md`` files of
    ``actual`` that ``expected`` does not have (a generated folder must hold nothing else).
    """
    clean = _strip_verified if ignore_verified else (lambda text: text)
    stale = [name for name, content in expected.items() if name not in actual or clean(actual[name]) != clean(content)]
    if exact:
        stale += [name for name in actual if name not in expected]
    return sorted(stale)


def _read_directory(directory: Path, names: Iterable[str] | None = None) -> dict[str, str]:
    if names is None:
        paths = sorted(directory.glob("*.md"))
    else:
        paths = [directory / name for name in names if (directory / name).is_file()]
    return {path.name: path.read_text(encoding="utf-8") for path in paths}


def check_directory(
    expected: Mapping[str, str], directory: str | Path, *, ignore_verified: bool = False, exact: bool = False
) -> list[str]:
    """:func:`stale_reports` of the files in ``directory`` (missing ones are stale)."""
    directory = Path(directory)
    actual = _read_directory(directory, None if exact else expected)
    return stale_reports(expected, actual, ignore_verified=ignore_verified, exact=exact)


def packaged_reports() -> dict[str, str]:
    """The reports installed with the package: file name → content."""
    root = resources.files(_PACKAGE).joinpath(_FOLDER)
    return {
        entry.name: entry.read_text(encoding="utf-8")
        for entry in sorted(root.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".md")
    }


def packaged_directory() -> Path | None:
    """The folder of the packaged reports when it is a real directory on disk (None in a zip or wheel cache)."""
    root = resources.files(_PACKAGE).joinpath(_FOLDER)
    return Path(str(root)) if isinstance(root, Path) and root.is_dir() else None


def source_tree_directory() -> Path | None:
    """``derivations/`` next to the package in a source checkout (with its ``pyproject.toml``), else None."""
    top = Path(__file__).resolve().parents[3]
    folder = top / "derivations"
    return folder if folder.is_dir() and (top / "pyproject.toml").is_file() else None


def write_derivations(
    directory: str | Path,
    files: Mapping[str, str] | None = None,
    *,
    force: bool = False,
    exact: bool = False,
) -> list[str]:
    """Write the reports into ``directory``; returns the names written (files already identical are skipped).

    Parameters
    ----------
    directory : str or Path
        Target folder, created if needed; nothing outside it is touched.
    files : mapping, optional
        Name → content (default: :func:`render_derivations` without verification lines).
    force : bool
        Replace files whose content differs.  Without it such files make the call raise
        :class:`FileExistsError` naming them, and nothing is written.
    exact : bool
        The folder is a generated copy: ``.md`` files that are not in ``files`` are removed.

    Raises
    ------
    FileExistsError
        Files differ and ``force`` is False.
    """
    directory = Path(directory)
    files = render_derivations() if files is None else files
    unsafe = [name for name in files if Path(name).name != name or name.startswith(".") or not name.endswith(".md")]
    if unsafe:
        raise ValueError(f"report names must be plain file names ending in .md, got {unsafe}")
    existing = _read_directory(directory, files) if directory.is_dir() else {}
    differing = sorted(name for name, content in existing.items() if content != files[name])
    if differing and not force:
        raise FileExistsError(
            f"{len(differing)} file(s) in {directory} differ from the new reports and were left alone: "
            f"{', '.join(differing)}; pass --force (force=True) to replace them"
        )
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in files.items():
        if existing.get(name) != content:
            (directory / name).write_text(content, encoding="utf-8")
            written.append(name)
    if exact:
        for path in directory.glob("*.md"):
            if path.name not in files:
                path.unlink()
                written.append(path.name)
    return sorted(written)

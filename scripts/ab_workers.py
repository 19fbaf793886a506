"""The A/B driver shared by ``ab_speed.py`` and ``ab_lookup.py``: one worker process per source tree (its own
``BANDCORE_CACHE``, so generated modules never mix), asked for the same measurements in alternating order, rep
after rep; rep 0 (compilation, seed tables) is not counted."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

TAGS = ("before", "after")


def start_workers(script: str, trees: dict[str, str]) -> dict[str, subprocess.Popen]:
    """``python script <tree> - --worker`` for each tag; each prints one 'ready ...' line, echoed here."""
    workers = {}
    for tag in TAGS:
        env = dict(os.environ, BANDCORE_CACHE=tempfile.mkdtemp(prefix=f"ab-{tag}-"))
        workers[tag] = subprocess.Popen([sys.executable, script, os.path.abspath(trees[tag]), "-", "--worker"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                        cwd=tempfile.gettempdir())  # fmt: skip
        print(tag, workers[tag].stdout.readline().strip(), flush=True)
    return workers


def interleaved(workers: dict[str, subprocess.Popen], rows: list[tuple], reps: int) -> dict[tuple, list[float]]:
    """{(*row, tag): the reps' answers}: each row sent tab-separated to both workers, in alternating order."""
    times: dict[tuple, list[float]] = {}
    for rep in range(reps + 1):
        for row in rows:
            for tag in TAGS if rep % 2 else TAGS[::-1]:
                workers[tag].stdin.write("\t".join(map(str, row)) + "\n")
                workers[tag].stdin.flush()
                value = float(workers[tag].stdout.readline())
                if rep:
                    times.setdefault((*row, tag), []).append(value)
    return times

"""Run code in a fresh interpreter on a given kernel cache (what a new process of a user sees)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def fresh_env(cache: Path) -> dict[str, str]:
    """The environment of a fresh process on ``cache`` importing this checkout's bandcore."""
    return {**os.environ, "BANDCORE_CACHE": str(cache), "PYTHONPATH": str(ROOT)}


def fresh_json(code: str, cache: Path) -> Any:
    """The last line ``code`` prints, read as JSON, run in a fresh interpreter on ``cache`` (which must exit 0)."""
    done = subprocess.run([sys.executable, "-c", code], env=fresh_env(cache), capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])

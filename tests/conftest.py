"""Fixtures shared by several test modules."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

TRL_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trl_grpo.py"


@pytest.fixture(scope="session")
def trl_example():
    """``examples/trl_grpo.py`` imported as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("trl_grpo_example", TRL_EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

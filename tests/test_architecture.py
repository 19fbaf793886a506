"""Properties of the package's shape: light imports, one grammar everywhere, backends that share nothing stale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bandcore as bc
from bandcore.cli import main

HEAVY = ("sympy", "cvxpy", "numba", "torch", "matplotlib")


def _loaded_after(code: str, cache: Path | None = None) -> list[str]:
    """Heavy top-level packages loaded by ``code`` in a fresh interpreter (``cache``: its kernel cache)."""
    script = f"import sys, json\n{code}\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    env = {**os.environ, "BANDCORE_CACHE": str(cache)} if cache is not None else None
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env).stdout
    return sorted(set(json.loads(out.strip().splitlines()[-1])) & set(HEAVY))


def test_import_bandcore_loads_numpy_only():
    assert _loaded_after("import bandcore") == []


def test_public_names_resolve_lazily():
    assert _loaded_after("import bandcore as bc; bc.band; bc.band_log; bc.Divergence; bc.resolve") == []
    assert callable(bc.band) and callable(bc.derive) and callable(bc.verify)


def test_kl_band_on_numpy_loads_no_heavy_library():
    code = "import numpy as np, bandcore as bc; bc.band(np.log([0.01, 0.5]), 'kl', 0.05, backend='numpy')"
    assert _loaded_after(code) == []
    for name in ("tv", "pearson", "bandkl"):
        assert _loaded_after(code.replace("'kl'", repr(name))) == []


def test_shipped_table_lookup_loads_no_heavy_library(tmp_path):
    """Loading a shipped table (its spot check runs the exact KL solver) and a small lookup: NumPy only, with
    backend="numpy" always and with "auto" on a cold kernel cache (a ready Numba kernel is picked: see
    tests/tables/test_tables_auto.py)."""
    load = "import numpy as np, bandcore as bc; t = bc.BandTable.shipped('kl', 0.05); "
    assert _loaded_after(load + "t.log(np.log([0.01, 0.5]), backend='numpy')") == []
    assert _loaded_after(load + "t.log(np.log([0.01, 0.5]))", cache=tmp_path) == []


def test_submodule_import_keeps_the_public_functions():
    import importlib

    importlib.import_module("bandcore.band")
    importlib.import_module("bandcore.derive")
    assert callable(bc.band) and callable(bc.derive)
    assert bc.band is importlib.import_module("bandcore.band").band


SPELLINGS = ["kl", "BandKL", "alpha(0.5)", "alpha(alpha=0.5)", "(u-1)**4", "where(u < 1, (u-1)**2, 2*(u-1)**2)",
             "(u-1)**2 + cosh(u-1) - 1"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_one_grammar_at_every_entry_point(spelling, capsys):
    div = bc.resolve(spelling)
    assert bc.resolve(div.spelling) == div  # canonical names round-trip
    assert bc.resolve(div) is div
    log_p = np.log([0.01, 0.3, 0.9])
    expected = bc.band_log(log_p, div, 0.05, backend="numpy")
    got = bc.band_log(log_p, spelling, 0.05, backend="numpy")
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    assert main(["bounds", "--divergence", spelling, "--delta", "0.05", "--p", "0.3"]) == 0
    assert div.name in capsys.readouterr().out
    torch = pytest.importorskip("torch")
    from bandcore.rl import band_policy_loss

    shape = (2, 3)
    old = torch.log(torch.tensor([[0.01, 0.3, 0.9], [0.2, 0.5, 0.7]], dtype=torch.float64))
    new = old + 0.3
    args = (new, old, torch.tensor([1.0, -1.0], dtype=torch.float64), torch.ones(shape, dtype=torch.float64))
    loss_a, _ = band_policy_loss(*args, divergence=spelling, delta=0.05)
    loss_b, _ = band_policy_loss(*args, divergence=div, delta=0.05)
    assert torch.equal(loss_a, loss_b)


def test_backends_agree_after_mixed_use():
    """A user generator solved on NumPy, then Numba, then torch, then NumPy again: one answer, no stale cache."""
    torch = pytest.importorskip("torch")
    div = bc.Divergence.from_expression("(u - 1)**2 + (sqrt(u) - 1)**2", name="mixed")
    log_p = -np.logspace(-8, 2.5, 64)
    first = bc.band_log(log_p, div, 0.05, backend="numpy")
    numba = bc.band_log(log_p, div, 0.05, backend="numba")
    tensor = bc.band_log(torch.from_numpy(log_p), div, 0.05, backend="torch")
    again = bc.band_log(log_p, div, 0.05, backend="numpy")
    for a, b, c, d in zip(first, numba, tensor, again, strict=True):
        np.testing.assert_array_equal(a, d)
        np.testing.assert_allclose(b, a, rtol=1e-13)
        np.testing.assert_allclose(c.numpy(), a, rtol=1e-13)

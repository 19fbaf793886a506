"""Followed from ``band()``, a divergence goes down the layers once: resolve -> plan -> bind -> call.

The path of a divergence is the sequence of bandcore modules whose functions receive it, as its spelling, its
resolved :class:`~bandcore.Divergence` or its :class:`~bandcore.plan.SolverPlan` (an argument or ``self``), in
call order, consecutive repeats merged.  Its length counts module visits; a step from a module to one of a higher
layer (the ``layers`` contract of ``pyproject.toml``) is a return to a higher layer.  Measured on a warm call and on
the first call of a new process whose disk cache is warm.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bandcore as bc

ROOT = Path(__file__).resolve().parents[2]
MAX_VISITS, MAX_RETURNS = 30, 3

#: The tracer, run in this process and in subprocesses (a string, so that a fresh interpreter can run it too).
TRACER = r'''
import sys, tomllib
from pathlib import Path


def layer_of(layers, module):
    for index, names in enumerate(layers):
        for name in names:
            if module == name or module.startswith(name + ".") or module.startswith(name + "_"):
                return index
    return None


def divergence_path(call, spelling, pyproject):
    """(visited modules, returns to a higher layer) of ``call()``, following ``spelling`` and every
    Divergence and SolverPlan (what the spelling becomes on the way down)."""
    contracts = tomllib.loads(Path(pyproject).read_text())["tool"]["importlinter"]["contracts"]
    order = next(c["layers"] for c in contracts if c["type"] == "layers" and "containers" not in c)
    layers = [[name.strip() for name in entry.split("|")] for entry in order]
    path = []

    def carried(value):
        return value is spelling or type(value).__name__ in ("Divergence", "SolverPlan")

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if layer_of(layers, module) is None:
            return
        code = frame.f_code
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        if any(carried(frame.f_locals.get(name)) for name in names) and (not path or path[-1] != module):
            path.append(module)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    returns = sum(1 for a, b in zip(path, path[1:]) if layer_of(layers, b) < layer_of(layers, a))
    return path, returns
'''
_NAMESPACE: dict = {}
exec(TRACER, _NAMESPACE)


CASES = [("kl", "numpy"), ("js", "numba"), ("(u-1)**4", "numpy"), ("alpha(0.7)", "torch"), ("cosh(u-1)-1", "auto")]


@pytest.mark.parametrize(("spelling", "backend"), CASES)
def test_a_warm_call_goes_down_the_layers_once(spelling, backend):
    if backend == "torch":
        torch = pytest.importorskip("torch")
        x = torch.log(torch.linspace(0.01, 0.9, 64, dtype=torch.float64))
    else:
        x = np.log(np.linspace(0.01, 0.9, 64))
    expected = bc.band(x, spelling, 0.05, backend=backend)  # warm: plan, seeds and kernel made
    path, returns = _NAMESPACE["divergence_path"](lambda: bc.band(x, spelling, 0.05, backend=backend),
                                                  spelling, ROOT / "pyproject.toml")
    assert len(path) <= MAX_VISITS and returns <= MAX_RETURNS, path
    assert path[0] == "bandcore.band" and any(m.startswith("bandcore.kernels") for m in path), path
    again = bc.band(x, spelling, 0.05, backend=backend)
    for a, b in zip(expected, again, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_first_call_of_a_new_process_goes_down_the_layers_once(tmp_path):
    """A user formula's first ``band()`` in a process whose disk cache holds its plan and seeds."""
    env = {**os.environ, "BANDCORE_CACHE": str(tmp_path), "PYTHONPATH": str(ROOT)}
    warm = "import numpy as np, bandcore as bc; bc.band(np.log([0.01, 0.5]), 'abs(u-1)**1.5', 0.05, backend='numpy')"
    subprocess.run([sys.executable, "-c", warm], env=env, check=True, timeout=600)
    script = TRACER + f'''
import json, numpy as np, bandcore as bc
spelling = "abs(u-1)**1.5"
x = np.log([0.01, 0.5])
path, returns = divergence_path(lambda: bc.band(x, spelling, 0.05, backend="numpy"), spelling,
                                {str(ROOT / "pyproject.toml")!r})
print(json.dumps([path, returns, "sympy" in sys.modules]))
'''
    out = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True,
                         timeout=600).stdout  # fmt: skip
    path, returns, sympy_loaded = json.loads(out.strip().splitlines()[-1])
    assert not sympy_loaded
    assert len(path) <= MAX_VISITS and returns <= MAX_RETURNS, path

"""What no plan changes (the seed reads, the input conventions, the blocks' helpers) lives in one generated module
that every plan's module imports: compiled once, for all plans."""

from __future__ import annotations

import numpy as np
import pytest
from fresh import fresh_json

import bandcore as bc
from bandcore.derive import solver_plan
from bandcore.kernels import compiled, drivers, sources

#: Compiles (Numba cache misses) per generated module in a fresh process after one Band call with Numba.
COMPILES = """
import sys, numpy as np, bandcore as bc, json
from numba.core.dispatcher import Dispatcher
bc.band_log(-np.logspace(-9, 2, 64), {spelling!r}, 0.05, backend="numba")
misses = {{}}
for name, module in list(sys.modules.items()):
    if name.startswith("bandcore_numba_"):
        prefix = "shared" if name.startswith("bandcore_numba_shared_") else "plan"
        count = sum(sum(f.stats.cache_misses.values()) for f in vars(module).values() if isinstance(f, Dispatcher))
        misses[prefix] = misses.get(prefix, 0) + count
print(json.dumps(misses))
"""


def test_a_plan_module_imports_the_shared_names_and_defines_its_own():
    plan = solver_plan(bc.resolve("js"))
    source = compiled.plan_source(plan)
    shared = sources.generated_name(drivers.shared_source(), drivers.SHARED_PREFIX)
    assert f"from {shared} import " in source
    shared_names = sources._defined(drivers.shared_source())
    assert {"seed_log_w", "interpolate", "finish", "clamped", "by_value", "LEFT_END", "TOL"} <= set(shared_names)
    assert "def seed_log_w(" not in source and "def interpolate(" not in source  # imported, not defined again
    assert "def generic_polished_bounds(" in source


@pytest.mark.slow
def test_a_second_plan_compiles_only_its_own_functions(tmp_path):
    """On a cache where one generic plan ran (js), a new one (a user's formula) compiles its own functions and
    none of the shared module's (loaded from the cache), and its bounds are those of a cold cache."""
    first = fresh_json(COMPILES.format(spelling="js"), tmp_path)
    assert first["shared"] > 0 and first["plan"] > 0
    user = "(u-1)**4 + abs(u-1)**1.5"
    second = fresh_json(COMPILES.format(spelling=user), tmp_path)
    assert second["shared"] == 0 and second["plan"] > 0
    x = -np.logspace(-9, 2, 64)
    np.testing.assert_allclose(bc.band_log(x, user, 0.05, backend="numba"),
                               bc.band_log(x, user, 0.05, backend="numpy"), rtol=1e-13, atol=0)  # fmt: skip

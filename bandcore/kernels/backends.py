r"""Binding the one solver source (:mod:`.solvers`) to a backend, with caches keyed by backend.

* **numpy** / **torch**: a fresh instance of the :mod:`.solvers` module whose ``xp`` is :data:`.ops.numpy_ops`
  or :func:`.ops.torch_ops` and whose per-divergence globals (``phi_r dphi_r f_s k_s``, ``F_AT_ZERO``,
  ``SLOPE_AT_INFINITY``, ``F2``, ``KINK``) come from :mod:`bandcore.derive.kernel_functions`.
* **numba**: a generated module — the source of :mod:`.solvers` with ``xp`` bound to :mod:`.numba_ops`
  (:mod:`.numba_fast_ops` for the closed forms, whose exp/log are written out so LLVM vectorises them), the
  divergence's functions as ``math`` code, every function wrapped in ``njit(cache=True)``, and one parallel
  driver that reads the input in its own dtype, clamps (0, tol] to 0, counts values above, and writes the
  (optionally exponentiated) bounds in the output dtype.  It is written once to the cache directory
  (``$BANDCORE_CACHE`` or ``~/.cache/bandcore``, named by a hash of its code), so Numba caches the machine
  code on disk.

Which solver: KL by its generator (any spelling of −log u + c(u − 1)), TV and Pearson likewise, every other
divergence the generic safeguarded Newton.  Only the generic solver needs SymPy (its functions are generated
from the generator), so KL, TV and Pearson load no SymPy on any backend.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import math
import os
import sys
import tempfile
import threading
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .._contract import LOG_P_TOLERANCE
from ..divergences import Divergence, resolve
from . import solvers as _reference
from .ops import numpy_ops, torch_ops

__all__ = ["cache_dir", "lower_at_one", "numba_module", "solver_kind", "solver_module"]

_NORMALISED = {"kl": "-log(u)", "tv": "abs(u - 1)/2", "pearson": "(u - 1)**2"}
_LOCK = threading.Lock()


@lru_cache(maxsize=256)
def solver_kind(divergence: Divergence) -> str:
    """"kl", "tv", "pearson" (dedicated solvers) or "generic"."""
    if divergence.name in _NORMALISED and divergence.is_catalogue:
        return divergence.name
    if divergence.name.startswith("alpha(") and divergence.is_catalogue:
        return "kl" if divergence.params == (("alpha", 0.0),) else "generic"
    from ..derive.mpmath_g import checked_facts  # a user formula: compare normalised generators exactly

    mine = checked_facts(divergence).f_normalised
    for kind in _NORMALISED:
        if (mine - checked_facts(resolve(kind)).f_normalised).equals(0):
            return kind
    return "generic"


def _constants(divergence: Divergence) -> dict[str, float]:
    from ..derive.kernel_functions import generator_functions

    gf = generator_functions(divergence)
    return {"F_AT_ZERO": gf.f_at_zero, "SLOPE_AT_INFINITY": gf.slope_at_infinity, "F2": gf.f2, "KINK": gf.kink}


@lru_cache(maxsize=128)
def solver_module(backend: str, divergence: Divergence, kind: str | None = None) -> ModuleType:
    """A :mod:`.solvers` instance for ``backend`` ("numpy" or "torch") and ``divergence`` (cached per pair).

    ``kind="generic"`` forces the generic solver (the tests run it on KL, TV and Pearson too).
    """
    xp = numpy_ops if backend == "numpy" else torch_ops()
    kind = kind or solver_kind(divergence)
    if backend == "numpy" and kind != "generic":
        return _reference
    # a module of its own name (torch.compile looks globals up by module name), registered like any other
    name = f"{_reference.__name__}_{backend}_{kind}_{hashlib.sha256(divergence.formula.encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, _reference.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.xp = xp
    sys.modules[name] = module
    if kind == "generic":
        from ..derive.kernel_functions import side_callables

        for name, value in {**side_callables(divergence, xp), **_constants(divergence)}.items():
            setattr(module, name, value)
    return module


@lru_cache(maxsize=512)
def lower_at_one(divergence: Divergence, delta: float) -> float:
    r"""log r_lo at p = 1 (perspective convention :math:`0\cdot\tilde f(x/0) = x\sigma_\infty`).

    The root of :math:`\tilde f(s) + (1-s)\sigma_\infty = \delta`, solved with the generic solver's own
    step in :math:`w = -\log s`; ``-inf`` when it saturates, 0 when :math:`\sigma_\infty = \infty`.
    """
    kind = solver_kind(divergence)
    if kind == "kl":
        return -delta
    if kind == "tv":  # r_lo(1) = 1 - delta
        return math.log1p(-delta) if delta < 1 else -math.inf
    if kind == "pearson":  # sigma_inf = inf: no mass can leave the token
        return 0.0
    module = solver_module("numpy", divergence, "generic")
    sigma, f0, f2, kink = module.SLOPE_AT_INFINITY, module.F_AT_ZERO, module.F2, module.KINK
    if not math.isfinite(sigma):
        return 0.0
    if f0 + sigma <= delta:
        return -math.inf
    w = np.array(math.sqrt(2.0 * delta / f2) if f2 > 0 else delta / max(kink, 1.0))
    lo, hi, w_prev, g_prev = np.array(0.0), np.array(1e308), np.array(math.nan), np.array(math.nan)
    with np.errstate(all="ignore"):
        for _ in range(module.MAX_ITERATIONS):
            x, log_s = np.expm1(-w), -w
            s = np.exp(log_s)
            g = module.f_s(x, log_s, s) - x * sigma
            slope = -module.k_s(x, log_s, s) + s * sigma
            candidate, lo, hi, converged = module.step(g, slope, w, lo, hi, w_prev, g_prev, delta)
            w_prev, g_prev, w = w, g, candidate
            if converged:
                break
    return -float(w)


# ------------------------------------------------------------------------------------------------------------
# Numba: the generated module
# ------------------------------------------------------------------------------------------------------------

#: LLVM fast-math flags that keep NaN/inf semantics (full fastmath breaks isnan and inf comparisons).
FASTMATH = ("arcp", "contract", "nsz")

_DRIVER = '''

@njit(cache=True, parallel=True, fastmath=FASTMATH, error_model="numpy")
def band_kernel(old_log_prob, delta, lower_at_one, ratios, lower, upper, status, seed):
    """One pass: clamp (0, TOL] to 0, count values above TOL, bounds in float64, store in the output dtype."""
    above = 0
    for i in prange(old_log_prob.size):
        lp = np.float64(old_log_prob[i])
        above += lp > TOL
        lp = 0.0 if lp > 0.0 and lp <= TOL else lp
        lo, up, st = {entry}(lp, delta, lower_at_one, seed)
        if ratios:
            lo = xp.exp(lo)
            up = xp.exp(up)
        lower[i] = lo
        upper[i] = up
        status[i] = np.int8(st)
    return above
'''


def cache_dir() -> Path:
    """Where generated kernel modules (and Numba's cache of them) live."""
    root = os.environ.get("BANDCORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "bandcore"
    )
    return Path(root) / "numba"


class _LazySelects(ast.NodeTransformer):
    """``xp.where(c, a, b)`` -> ``a if c else b`` and ``xp.logical_and/or`` -> ``and``/``or``: the same
    arithmetic, but a scalar evaluates only the branch it takes (vectorised backends must compute both)."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "xp"):
            return node
        if func.attr == "where" and len(node.args) == 3:
            return ast.IfExp(test=node.args[0], body=node.args[1], orelse=node.args[2])
        if func.attr in ("logical_and", "logical_or") and len(node.args) == 2:
            return ast.BoolOp(op=ast.And() if func.attr == "logical_and" else ast.Or(), values=list(node.args))
        return node


def _scalar_source(source: str) -> str:
    return ast.unparse(ast.fix_missing_locations(_LazySelects().visit(ast.parse(source))))


def _numba_source(divergence: Divergence, kind: str) -> str:
    ops = "numba_fast_ops" if kind in ("tv", "pearson") else "numba_ops"
    source = inspect.getsource(_reference)
    if ops == "numba_ops":  # the closed forms keep their selects: branch-free loops vectorise
        source = _scalar_source(source)
    source = source.replace(
        "from .ops import numpy_ops as xp",
        f"import numpy as np\nfrom numba import njit, prange\n\nfrom bandcore.kernels import {ops} as xp",
    )
    functions = [name for name, value in vars(_reference).items() if inspect.isfunction(value)
                 and value.__module__ == _reference.__name__]
    lines = ["\nimport math", f"FASTMATH = set({list(FASTMATH)!r})", f"TOL = {LOG_P_TOLERANCE!r}"]
    if kind == "generic":
        from ..derive.kernel_functions import generator_functions

        gf = generator_functions(divergence)
        lines += [f"{name} = {_literal(value)}" for name, value in _constants(divergence).items()]
        lines += [""]
        for fn in gf.functions:
            lines += ["@njit(cache=True, fastmath=FASTMATH, error_model='numpy')", fn.math_source()]
    jit = 'njit(cache=True, fastmath=FASTMATH, error_model="numpy")'
    lines += [f"{name} = {jit}({name})" for name in functions]
    entry = _reference.ENTRY_POINTS["kl_seeded" if kind == "kl" else kind]  # scalar KL: table-seeded
    return source + "\n".join(lines) + _DRIVER.replace("{entry}", entry)


def _literal(value: float) -> str:
    return "math.inf" if value == math.inf else repr(float(value))


#: The KL start table: log w(logit p), w = 1/(e^d - 1) at the upper root, on [-TABLE_EDGE, TABLE_EDGE].
#: Cubic Hermite interpolation errs by ~1e-7 relative; one Halley step takes that below 1e-16.
TABLE_EDGE = 740.0
TABLE_STEP = 0.125
NO_SEED = (0.0, 1.0, np.zeros(2), np.zeros(2))


@lru_cache(maxsize=16)
def kl_start_table(delta: float) -> tuple[float, float, np.ndarray, np.ndarray]:
    r"""(theta0, step, F, F') with :math:`F(\theta_p) = \log w` on a uniform grid of logit p, from the KL
    solver itself.  :math:`dd/d\theta_p = d(1-p)/x - 1` by implicit differentiation of
    :math:`\mathrm{kl}(p, q) = \delta` (:math:`x = r - 1`), and :math:`d\log w/dd = -(1 + w)`; cached per δ."""
    theta = np.arange(-TABLE_EDGE, TABLE_EDGE + TABLE_STEP / 2, TABLE_STEP)
    lp, lq = -np.logaddexp(0.0, -theta), -np.logaddexp(0.0, theta)  # log sigma(theta), log(1 - sigma(theta))
    with np.errstate(all="ignore"):
        log_r, log_s = _reference.kl_upper_root(lp, lq, delta)
        d = log_r - log_s  # r = e^d s
        log_w = -d - np.log(-np.expm1(-d))
        slopes = -(1.0 + np.exp(log_w)) * (d * np.exp(lq) / np.expm1(log_r) - 1.0)
    return float(theta[0]), TABLE_STEP, log_w, slopes


@lru_cache(maxsize=64)
def numba_module(divergence: Divergence, kind: str | None = None) -> ModuleType:
    """The generated, compiled module of ``divergence`` (cached per divergence; machine code cached on disk).

    Its ``band_kernel(old_log_prob, delta, lower_at_one, ratios, lower, upper, status, seed)`` runs the solver of
    ``kind`` (default :func:`solver_kind`).
    """
    kind = kind or solver_kind(divergence)
    source = _numba_source(divergence, kind)
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    name = f"bandcore_numba_{kind}_{digest}"
    with _LOCK:
        if name in sys.modules:
            return sys.modules[name]
        directory = cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{name}.py"
        if not path.exists() or path.read_text() != source:
            fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
            with os.fdopen(fd, "w") as handle:
                handle.write(source)
            os.replace(tmp, path)  # atomic: concurrent writers produce the same file
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module


def run_numba(divergence: Divergence, old_log_prob: np.ndarray, delta: float, *, ratios: bool = False,
              out_dtype: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(lower, upper, status, n_above) for a float32/float64 array in one parallel pass (see the module doc)."""
    module = numba_module(divergence)
    flat = np.ascontiguousarray(old_log_prob).reshape(-1)
    dtype = flat.dtype if out_dtype is None else np.dtype(out_dtype)
    lower = np.empty(flat.shape, dtype=dtype)
    upper = np.empty(flat.shape, dtype=dtype)
    status = np.empty(flat.shape, dtype=np.int8)
    seed = kl_start_table(float(delta)) if solver_kind(divergence) == "kl" else NO_SEED
    above = module.band_kernel(flat, float(delta), lower_at_one(divergence, float(delta)), bool(ratios),
                               lower, upper, status, seed)
    shape = np.shape(old_log_prob)
    return lower.reshape(shape), upper.reshape(shape), status.reshape(shape), int(above)

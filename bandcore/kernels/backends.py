r"""Binding a plan to a backend, a δ and a device: :func:`bind`, with the one cache of what is made from a plan.

``bind(plan, delta, backend, device=..., ratios=...)`` returns a callable solver; everything it is made of comes
from one cache (:data:`CACHE`, keyed by the plan's ``key``, δ, backend and device), and so does the solver itself:

* ``"numpy"``: :class:`ArraySolver` — :func:`.vectorised.solve_arrays` with the plan's NumPy solver module;
* ``"numba"``: :class:`.compiled.CompiledSolver` — one pass of the plan's compiled drivers;
* ``"torch"``: :class:`TensorSolver` — the plan's torch solver module on tensors of one device, in chunks; on the
  CPU the tokens the seeded pass leaves go to the Numba binding of the same plan once its kernel is ready.

The seed tables (:mod:`.seeds`, on disk for generic plans), :math:`\log r_{lo}` at p = 1 and the modules are
shared by the solvers of one plan.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import Any

import numpy as np

from .._contract import LOG_P_TOLERANCE, Status
from ..plan import SolverPlan
from .compiled import CompiledSolver, is_ready, module_name
from .drivers import SERIAL_MAX
from .grid import KernelBound
from .opaque import register, safeguarded_band
from .seeds import NO_SEED, seed_table
from .solvers.common import RATIO_ENTRY_POINTS
from .thresholds import threshold_seed
from .vectorised import (
    build_module,
    can_select,
    compiling,
    release_point,
    solve_arrays,
    solve_lower_at_one,
    solve_ratio_arrays,
)

__all__ = ["CACHE", "SERIAL_MAX", "ArraySolver", "PlanCache", "TensorSolver", "bind", "lower_at_one", "numba_ready",
           "seed", "solver_module"]

#: Tokens per torch chunk, by device type, where set (else :func:`torch_chunk`'s rule): the solver keeps a few
#: dozen chunk-sized float64 temporaries alive, so chunking bounds its memory by a constant.
TORCH_CHUNK: dict[str, int] = {}
#: On the CPU, tokens per chunk and thread: torch's grain of parallel element-wise work, so that each operation
#: hands every thread one grain (500k tokens on one thread, 2^15 against 2^16 tokens a chunk: 1.13-1.29x; on two,
#: 2^16 the fastest of 2^15-2^17: ``docs/kernel_measurements.md``).
TORCH_CPU_CHUNK_PER_THREAD = 1 << 15
#: On an accelerator: large enough to amortise the launches.
TORCH_CHUNK_ACCELERATOR = 1 << 22


def torch_chunk(device_type: str) -> int:
    """Tokens per chunk of the torch solver on a device of this type (:data:`TORCH_CHUNK` where set; on the CPU
    :data:`TORCH_CPU_CHUNK_PER_THREAD` per torch thread; else :data:`TORCH_CHUNK_ACCELERATOR`)."""
    import torch

    if device_type in TORCH_CHUNK:
        return TORCH_CHUNK[device_type]
    if device_type == "cpu":
        return TORCH_CPU_CHUNK_PER_THREAD * max(1, torch.get_num_threads())
    return TORCH_CHUNK_ACCELERATOR


class PlanCache:
    """The one cache of what is made from plans: a least-recently-used map of at most ``size`` entries, each keyed
    by a tuple that starts with what it is (``"solver"``, ``"module"``, ``"seed"``, ...) and the plan's ``key``."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple, make: Callable[[], Any]) -> Any:
        """The entry of ``key``, made by ``make()`` (outside the lock) when missing."""
        try:  # a hit takes no lock: each of these two steps is one operation of the dict (atomic)
            self._entries.move_to_end(key)
            return self._entries[key]
        except KeyError:
            pass  # missing (or evicted between the two steps)
        value = make()
        with self._lock:
            value = self._entries.setdefault(key, value)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value

    def keys(self) -> list[tuple]:
        """The keys held, oldest first (what this process has bound: tests read it)."""
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


CACHE = PlanCache(512)


def bind(plan: SolverPlan, delta: float, backend: str, *, device: str = "cpu", ratios: bool = False) -> Any:
    """The solver of ``plan`` at ``delta`` on ``backend`` ("numpy", "numba" or "torch"; torch on ``device``): log
    bounds, or with ``ratios`` the ratio bounds (cached: :data:`CACHE`)."""
    key = ("solver", plan.key, delta, backend, device if backend == "torch" else "cpu", ratios)
    return CACHE.get(key, lambda: _make(plan, float(delta), backend, device, ratios))


def _make(plan: SolverPlan, delta: float, backend: str, device: str, ratios: bool) -> Any:
    if backend == "numba":
        return CompiledSolver(plan, delta, ratios, lower_at_one(plan, delta), seed(plan, delta).arrays())
    if backend == "numpy":
        return ArraySolver(plan, delta, ratios, solver_module(plan, "numpy"), lower_at_one(plan, delta),
                           seed(plan, delta).numpy_arrays())  # fmt: skip
    if backend == "torch":
        return TensorSolver(plan, delta, ratios, device)
    raise ValueError(f"backend must be 'numpy', 'numba' or 'torch', got {backend!r}")


def solver_module(plan: SolverPlan, backend: str) -> ModuleType:
    """The solvers bound to ``backend`` ("numpy" or "torch") and ``plan`` (:func:`.vectorised.build_module`)."""
    return CACHE.get(("module", plan.key, backend), lambda: build_module(plan, backend))


def seed(plan: SolverPlan, delta: float) -> KernelBound:
    """The seed table of ``plan``'s solver at ``delta`` (:mod:`.seeds`); for the closed forms, which need none,
    their saturation thresholds as double-double logarithms in its place (:mod:`.thresholds`)."""
    if plan.kind in ("tv", "pearson"):
        return threshold_seed(plan.kind, float(delta))
    if plan.kind not in ("kl", "generic"):
        return NO_SEED
    delta = float(delta)
    return CACHE.get(("seed", plan.key, delta), lambda: seed_table(solver_module(plan, "numpy"), plan, delta))


def lower_at_one(plan: SolverPlan, delta: float) -> float:
    """log r_lo at p = 1 for ``plan`` at ``delta`` (:func:`.vectorised.solve_lower_at_one`)."""
    delta = float(delta)
    return CACHE.get(("at_one", plan.key, delta),
                     lambda: solve_lower_at_one(plan, delta, solver_module(plan, "numpy")))


def numba_ready(plan: SolverPlan, ratios: bool, dtype: Any, size: int) -> bool:
    """Whether the Numba kernel of ``plan`` for this output, input dtype and size runs without a compile: it ran in
    this process, or its machine code is in the cache on disk (:func:`.compiled.is_ready`)."""
    name = CACHE.get(("numba module name", plan.key), lambda: module_name(plan))
    return is_ready(name, ratios, dtype, size)


class ArraySolver:
    """The NumPy solver of a plan at one δ: ``solver(flat) -> (lower, upper, status, n_above)`` for a 1-D float
    array: (0, TOL] read as 0, NaN (status INVALID_INPUT) above TOL, bounds in the input's float dtype (float32 or
    float64; others: float64)."""

    def __init__(self, plan: SolverPlan, delta: float, ratios: bool, module: ModuleType, at_one: float,
                 seed: tuple) -> None:  # fmt: skip
        self.plan, self.delta, self.ratios = plan, delta, ratios
        self._module, self._at_one, self._seed = module, at_one, seed

    def __call__(self, flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        dtype = flat.dtype if flat.dtype in (np.float32, np.float64) else np.dtype(np.float64)
        lp = np.asarray(flat, dtype=np.float64)
        above = lp > LOG_P_TOLERANCE
        lp = np.where((lp > 0) & ~above, 0.0, lp)
        solve = solve_ratio_arrays if self.ratios else solve_arrays
        with np.errstate(all="ignore"):  # (also the casts: a bound beyond float32's range is its ±inf)
            lower, upper, status = solve(self._module, self.plan.kind, lp, self.delta, self._at_one, self._seed)
            return (np.asarray(lower, dtype=dtype), np.asarray(upper, dtype=dtype), np.asarray(status, dtype=np.int8),
                    int(np.count_nonzero(above)))  # fmt: skip


#: the tokens from which a call compiles a Numba kernel it needs (its first compile, seconds, pays off there;
#: below, a kernel that is not ready is not compiled): ``backend="auto"`` on the CPU, and the tokens the seeded
#: pass of torch on the CPU leaves
NUMBA_MIN_SIZE = 20_000


class TensorSolver:
    """The torch solver of a plan at one δ on one device.

    ``solver(flat) -> (lower, upper, status, None)`` for a 1-D float64 tensor ((0, TOL] read as 0; above TOL NaN,
    status INVALID_INPUT; not counted, which would cost a host synchronisation): float64 / int8 on its device,
    solved in chunks.  Where selecting tokens is free (the CPU), the chunks run the seeded pass only and the
    safeguarded solver then runs once on every token it left, in the compiled (Numba) binding of the same plan
    when its kernel is ready (compiled in this process or on disk) or at least :data:`NUMBA_MIN_SIZE` tokens are
    left: its iterations cost microseconds where torch's cost a fraction of a millisecond (per-operation
    overhead on a few hundred tokens); else in NumPy's binding (a CPU tensor's memory, no copy), whose per-operation
    overhead is a fraction of torch's (js, 10k tokens, one thread: 11.6 ms a call against 21.7 ms in torch's own
    loop, 5.9 ms with the Numba kernel), so that no call waits seconds for a first compile.
    :meth:`pure` is the solver in torch operations only (for ``torch.compile``).
    """

    def __init__(self, plan: SolverPlan, delta: float, ratios: bool, device: str) -> None:
        self.plan, self.delta, self.ratios, self.device = plan, delta, ratios, device
        self.direct = ratios and plan.kind in RATIO_ENTRY_POINTS  # TV, Pearson: the ratios themselves
        self._module = solver_module(plan, "torch")
        self._at_one = lower_at_one(plan, delta)
        self._seed = CACHE.get(("torch seed", plan.key, delta, device), lambda: seed(plan, delta).torch_arrays(device))
        # filed now, outside any trace: the operator torch.compile calls instead of the safeguarded solver's loop
        name = f"{self._module.__name__}|{plan.kind}|{delta!r}|{device}|{id(self):x}"
        self._opaque = None if self.direct else register(name, self)

    def safeguarded(self, lp: Any) -> tuple:
        """(lower, upper, status) of every token of ``lp`` by the safeguarded solver alone (torch operations)."""
        entry = getattr(self._module, self._module.ENTRY_POINTS[self.plan.kind])
        try:
            return entry(lp, self.delta, self._at_one, self._seed)
        finally:
            release_point(self._module)

    def pure(self, flat: Any, fallback: bool = True) -> tuple:
        """(lower, upper, status) in torch operations only (log bounds, or the ratios of a kind with a ratio form);
        ``fallback=False``: the seeded pass only (status NOT_CONVERGED where it left a token)."""
        if self.direct:
            return solve_ratio_arrays(self._module, self.plan.kind, flat, self.delta, self._at_one, self._seed)
        # while compiling: one opaque operator, not the safeguarded solver's loop unrolled into the graph
        safeguarded = partial(safeguarded_band, solver=self._opaque) if fallback and compiling() else None
        return solve_arrays(self._module, self.plan.kind, flat, self.delta, self._at_one, self._seed,
                            fallback=fallback, safeguarded=safeguarded)  # fmt: skip

    def __call__(self, flat: Any) -> tuple:
        import torch

        flat = torch.where((flat > 0) & (flat <= LOG_P_TOLERANCE), 0.0, flat)
        chunk = torch_chunk(flat.device.type)
        later = can_select(flat) and not self.direct
        lower = torch.empty(flat.shape, dtype=torch.float64, device=flat.device)
        upper = torch.empty_like(lower)
        status = torch.empty(flat.shape, dtype=torch.int8, device=flat.device)
        for start in range(0, flat.numel(), chunk):  # a loop over chunks, never over tokens
            part = slice(start, start + chunk)
            lower[part], upper[part], status[part] = self.pure(flat[part], fallback=not later)
        if later:
            redo = (status == int(Status.NOT_CONVERGED)).nonzero().reshape(-1)
            n = redo.numel()  # below NUMBA_MIN_SIZE (< chunk) the Numba kernel is called once, on n tokens
            if n and (n >= NUMBA_MIN_SIZE or numba_ready(self.plan, False, np.float64, n)):
                left = bind(self.plan, self.delta, "numba")
                for start in range(0, n, chunk):
                    index = redo[start : start + chunk]
                    lo, up, st, _ = left(np.ascontiguousarray(flat[index].numpy()))
                    lower[index], upper[index], status[index] = torch.from_numpy(lo), torch.from_numpy(up), \
                        torch.from_numpy(st)  # fmt: skip
            elif n:  # few tokens and no compiled kernel yet: NumPy's solver (a CPU tensor), not a compile
                lo, up, st, _ = bind(self.plan, self.delta, "numpy")(flat[redo].numpy())
                lower[redo], upper[redo], status[redo] = torch.from_numpy(lo), torch.from_numpy(up), \
                    torch.from_numpy(st)  # fmt: skip
        if self.ratios and not self.direct:
            lower, upper = lower.exp(), upper.exp()
        return lower, upper, status, None

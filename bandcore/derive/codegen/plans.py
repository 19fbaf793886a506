r"""The solver plan of a divergence (:class:`bandcore.plan.SolverPlan`): made once, kept in memory and on disk.

:func:`solver_plan` is what :mod:`bandcore.band` asks for before binding a solver.  KL, TV and Pearson of the
catalogue have plans without generated code (no SymPy); every other divergence's plan is read from the cache
(folder ``plans`` of :mod:`bandcore._cache`, JSON) when a process has made it before, so a new process binds a
user generator without importing SymPy; only a plan met for the first time is derived (:func:`build_plan`, SymPy)
and written there.  A plan file is named by a digest of the divergence and of the code that derives plans (this
subpackage's sources, :mod:`bandcore.plan`, :mod:`bandcore.divergences`), so an edit of that code derives plans
anew; one that does not load as a plan of this divergence (damaged, truncated, edited) is derived and written
again.
"""

from __future__ import annotations

import hashlib
import threading
from functools import lru_cache
from pathlib import Path

from ..._cache import read_bytes, write_atomic
from ...divergences import Divergence, resolve
from ...plan import PLAN_FORMAT, PlanError, SolverPlan

__all__ = ["PLANS_FOLDER", "build_plan", "solver_plan"]

#: Cache folder of the plans
PLANS_FOLDER = "plans"
#: Kinds with a dedicated solver, found by comparing normalised generators (KL: any spelling of -log u + c(u - 1))
_DEDICATED = ("kl", "tv", "pearson")
_PLANS: dict[tuple[str, str, bool], SolverPlan] = {}
_LOCK = threading.Lock()


def solver_plan(div: Divergence, *, generic: bool = False) -> SolverPlan:
    """The plan of ``div``'s solver (module docstring); ``generic=True``: the plan of the generic solver even where
    a dedicated one exists (the tests run it on KL, TV and Pearson too; the tables' pieces use its functions)."""
    key = (div.name, div.formula, generic)  # strings: no call into the divergence for its hash
    plan = _PLANS.get(key)
    if plan is None:
        plan = _load_or_build(div, generic)
        with _LOCK:
            plan = _PLANS.setdefault(key, plan)
    return plan


def _catalogue_kind(name: str, catalogue: bool, params: tuple) -> str | None:
    """The dedicated solver of a catalogue divergence known by its name (no SymPy), else None."""
    if not catalogue:
        return None
    if name in _DEDICATED:
        return name
    if name.startswith("alpha(") and params == (("alpha", 0.0),):
        return "kl"
    return None


def _load_or_build(div: Divergence, generic: bool) -> SolverPlan:
    catalogue = div.is_catalogue  # read once: the divergence goes no further than here unless SymPy must derive
    kind = None if generic else _catalogue_kind(div.name, catalogue, div.params)
    if kind is not None:
        return SolverPlan(name=div.name, formula=div.formula, kind=kind)
    name = _file_name(div.name, div.formula, catalogue, generic)
    data = read_bytes(PLANS_FOLDER, name)
    if data is not None:
        try:
            plan = SolverPlan.from_json(data.decode("utf-8"))
        except (PlanError, UnicodeDecodeError):
            plan = None  # damaged: derived and written again
        if plan is not None and (plan.name, plan.formula) == (div.name, div.formula):
            return plan
    plan = build_plan(div, generic=generic)
    try:
        write_atomic(PLANS_FOLDER, name, plan.to_json().encode("utf-8"))
    except OSError:
        pass  # an unwritable cache only costs the derivation in the next process
    return plan


def _file_name(name: str, formula: str, catalogue: bool, generic: bool) -> str:
    key = f"{PLAN_FORMAT}|{generic}|{name}|{formula}|{catalogue}|{_code_digest()}"
    return f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """A digest of the sources that derive a plan (read as files: no import, no SymPy)."""
    package = Path(__file__).resolve().parents[2]
    files = sorted([*package.joinpath("derive").rglob("*.py"), *package.joinpath("divergences").rglob("*.py"),
                    package / "plan.py"])  # fmt: skip
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.relative_to(package).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def build_plan(div: Divergence, *, generic: bool = False) -> SolverPlan:
    """Derive the plan of ``div`` with SymPy: its solver kind (a generator equal to KL's, TV's or Pearson's up to
    the affine terms gets their dedicated solver) and, for the generic solver, its functions and constants
    (:mod:`.kernel_functions`)."""
    from .kernel_functions import TAYLOR_RADIUS, generated_function, generator_functions

    kind = "generic" if generic else _kind_of(div)
    if kind != "generic":
        return SolverPlan(name=div.name, formula=div.formula, kind=kind)
    functions = generator_functions(div)
    return SolverPlan(
        name=div.name,
        formula=div.formula,
        kind="generic",
        functions=tuple(generated_function(fn, functions.far_x) for fn in functions.functions),
        f_at_zero=float(functions.f_at_zero),
        slope_at_infinity=float(functions.slope_at_infinity),
        f2=float(functions.f2),
        kink=float(functions.kink),
        taylor_radius=float(TAYLOR_RADIUS),
        far_x=float(functions.far_x),
        seed_key=functions.key(),
    )


def _kind_of(div: Divergence) -> str:
    """"kl", "tv" or "pearson" where ``div``'s normalised generator is theirs (compared exactly), else "generic"."""
    kind = _catalogue_kind(div.name, div.is_catalogue, div.params)
    if kind is not None:
        return kind
    if div.name.startswith("alpha(") and div.is_catalogue:
        return "generic"
    from ..generator_facts.mpmath_g import checked_facts

    mine = checked_facts(div).f_normalised
    for kind in _DEDICATED:
        if (mine - checked_facts(resolve(kind)).f_normalised).equals(0):
            return kind
    return "generic"

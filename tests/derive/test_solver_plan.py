"""The solver plan: what derive hands to the kernels — frozen, SymPy-free, JSON on disk, refused when damaged."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from fresh import fresh_json

import bandcore as bc
from bandcore.derive import solver_plan
from bandcore.derive.codegen.plans import PLANS_FOLDER, build_plan
from bandcore.plan import GENERATOR_FUNCTIONS, PlanError, SolverPlan, check_source

LOG_P = -np.logspace(-12, np.log10(800.0), 400)


@pytest.mark.parametrize("spelling, kind", [("kl", "kl"), ("tv", "tv"), ("pearson", "pearson"), ("alpha(0)", "kl"),
                                            ("js", "generic"), ("-log(u) + 3*(u - 1)", "kl"),
                                            ("(u-1)**2 + 3*(u - 1)", "pearson"), ("(u-1)**4", "generic")])  # fmt: skip
def test_the_plan_names_the_solver(spelling, kind):
    plan = solver_plan(bc.resolve(spelling))
    assert plan.kind == kind
    assert (plan.functions != ()) == (kind == "generic")
    if kind == "generic":
        assert tuple(fn.name for fn in plan.functions) == GENERATOR_FUNCTIONS


def test_generic_plan_round_trips_through_json_and_holds_no_sympy():
    plan = solver_plan(bc.resolve("abs(u-1)**1.5"))
    text = plan.to_json()
    again = SolverPlan.from_json(text)
    assert again == plan and again.key == plan.key
    document = json.loads(text)
    assert document["format"] == 1 and set(document) == {"format", "plan", "sha256"}

    def leaves(value):
        if isinstance(value, dict):
            for item in value.values():
                yield from leaves(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                yield from leaves(item)
        else:
            yield value

    assert all(isinstance(v, (str, float, int, type(None))) for v in leaves(document))
    with pytest.raises(AttributeError):
        plan.kind = "kl"  # frozen


def _edited(text: str, edit) -> str:
    document = json.loads(text)
    edit(document["plan"])
    return json.dumps(document)


def test_a_damaged_or_edited_plan_is_refused():
    text = solver_plan(bc.resolve("(u-1)**4")).to_json()
    for bad in (text[: len(text) // 2], "", "[]", "{}", text.replace('"format": 1', '"format": 99')):
        with pytest.raises(PlanError):
            SolverPlan.from_json(bad)
    with pytest.raises(PlanError, match="digest"):  # an edit that keeps the JSON valid
        SolverPlan.from_json(_edited(text, lambda plan: plan.update(kink=2.0)))


@pytest.mark.parametrize("source", [
    "import os\ndef closed(x, L, u):\n    return x",
    "def closed(x, L, u):\n    return __import__('os').system('true')",
    "def closed(x, L, u):\n    return x.__class__",
    "def closed(x, L, u):\n    return open('f')",
    "def closed(x, L, u):\n    return 'text'",
    "def closed(x, L, u):\n    return [y for y in x]",
    "def closed(x, u):\n    return x",
    "def other(x, L, u):\n    return x",
    "@decorator\ndef closed(x, L, u):\n    return x",
    "def closed(x, L, u):\n    return np.exp(x)",
])  # fmt: skip
def test_a_plan_source_must_be_plain_arithmetic(source):
    with pytest.raises(PlanError):
        check_source(source, "closed", ("x", "L", "u"))


def test_a_plan_with_the_wrong_functions_is_refused():
    plan = solver_plan(bc.resolve("(u-1)**4"))
    with pytest.raises(PlanError):
        replace(plan, functions=plan.functions[:-1])
    with pytest.raises(PlanError):
        replace(plan, kind="kl")  # a kl plan carries no functions
    with pytest.raises(PlanError):
        replace(plan, kind="newton")


def test_the_forced_generic_plan_of_kl_solves_kl():
    div = bc.resolve("kl")
    generic = solver_plan(div, generic=True)
    assert generic.kind == "generic" and solver_plan(div).kind == "kl"
    assert build_plan(div, generic=True) == generic


FIRST_CALL = """
import json, sys, numpy as np, bandcore as bc
lower, upper = bc.band_log(-np.logspace(-12, np.log10(800.0), 400), {spelling!r}, 0.05, backend="numpy")
print(json.dumps(["sympy" in sys.modules, lower.tolist(), upper.tolist()]))
"""


@pytest.mark.parametrize("spelling", ["max(u-2,0) + (u-1)**2", "cosh(u-1)-1"])
def test_a_new_process_with_a_warm_cache_skips_sympy(tmp_path, spelling):
    """The first process derives the plan (SymPy) and writes it beside the seeds; the next binds the user
    formula from the plan file without importing SymPy, with the same bounds bit for bit."""
    first = fresh_json(FIRST_CALL.format(spelling=spelling), tmp_path)
    assert first[0]  # derived
    assert len(list((tmp_path / PLANS_FOLDER).glob("*.json"))) == 1
    second = fresh_json(FIRST_CALL.format(spelling=spelling), tmp_path)
    assert not second[0]
    assert second[1:] == first[1:]


def test_a_damaged_plan_file_is_derived_again(tmp_path):
    spelling = "(u-1)**4 + abs(u-1)"
    first = fresh_json(FIRST_CALL.format(spelling=spelling), tmp_path)
    (file,) = (tmp_path / PLANS_FOLDER).glob("*.json")
    whole = file.read_bytes()
    edited = whole.replace(b'"kind": "generic"', b'"kind": "kl"')  # valid JSON, digest no longer matches
    for damaged in (whole[: len(whole) // 3], b"\xff\xfe not json", edited):
        file.write_bytes(damaged)
        again = fresh_json(FIRST_CALL.format(spelling=spelling), tmp_path)
        assert again[0]  # derived again (SymPy) ...
        assert again[1:] == first[1:]  # ... to the same bounds
        assert file.read_bytes() == whole  # and written again

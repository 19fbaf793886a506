"""The catalogue, the computed facts of each generator, and the one grammar (round trips, refusals, no code run)."""

from __future__ import annotations

import builtins
from typing import ClassVar

import pytest
import sympy as sp

import bandcore as bc
from bandcore.derive.generator_facts.symbolic import U, facts, to_sympy
from bandcore.divergences import Divergence, GeneratorError, get_divergence, list_divergences, resolve
from bandcore.divergences.catalogue import CATALOGUE
from bandcore.divergences.grammar import parse, to_text

# ---------------------------------------------------------------------------------------------- catalogue


def test_catalogue_names():
    assert list_divergences() == [*CATALOGUE, "alpha"]
    assert {"kl", "reverse_kl", "tv", "pearson", "hellinger", "js"} <= set(list_divergences())
    assert bc.list_divergences() == list_divergences()


def test_catalogue_generators_are_pairwise_distinct():
    """No catalogue entry is another in disguise: normalised generators f̃(u) = f(u) − f'(1)(u − 1) of two entries
    are never proportional (a multiple c·f̃ gives the Band of f̃ at radius δ/c, so it adds nothing)."""
    points = [sp.Rational(1, 5), sp.Rational(7, 10), sp.Rational(3, 2), 4, 9]
    entries = [get_divergence(name) for name in CATALOGUE] + [get_divergence("alpha")]
    rows = {}
    for div in entries:
        f = to_sympy(div.tree)
        normalised = f - sp.diff(f, U).subs(U, 1) * (U - 1)
        rows[div.name] = [float(normalised.subs(U, x)) for x in points]
    names = list(rows)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            ratios = [x / y for x, y in zip(rows[a], rows[b], strict=True)]
            assert max(ratios) - min(ratios) > 1e-6 * abs(max(ratios)), f"{a} and {b} are proportional generators"


@pytest.mark.parametrize(("alias", "name"), [("bandkl", "kl"), ("bandtv", "tv"), ("bandchi2", "pearson")])
def test_aliases(alias, name):
    assert get_divergence(alias) == get_divergence(name)
    assert get_divergence(alias.upper()).name == name


def test_alpha_parameter():
    assert get_divergence("alpha").name == "alpha(3)"
    a = get_divergence("alpha", alpha=0.5)
    assert a.name == "alpha(0.5)" and a.params == (("alpha", 0.5),)
    f = facts(a).f
    assert sp.simplify(f - (U**sp.Rational(1, 2) - 1 - (U - 1) / 2) / (sp.Rational(1, 2) * sp.Rational(-1, 2))) == 0
    assert sp.simplify(facts(get_divergence("alpha", alpha=2.0)).f - (U - 1) ** 2 / 2) == 0  # Pearson/2
    assert sp.simplify(facts(get_divergence("alpha", alpha=0.0)).f - (-sp.log(U) + U - 1)) == 0  # KL limit
    assert sp.simplify(facts(get_divergence("alpha", alpha=1.0)).f - (U * sp.log(U) - U + 1)) == 0  # reverse KL


def test_unknown_names_and_parameters():
    with pytest.raises(ValueError, match=r"unknown divergence 'klx'.*valid names: kl"):
        get_divergence("klx")
    with pytest.raises(TypeError, match="unknown parameter"):
        get_divergence("alpha", beta=1.0)
    with pytest.raises(TypeError, match="takes no parameters"):
        get_divergence("kl", alpha=2.0)
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        get_divergence("alpha", alpha=float("nan"))


# (f''(1), f'''(1), f''''(1), f̃(0), lim f̃(u)/u): known values for each generator, derived by hand
FACTS = {
    "kl": (1, -2, 6, sp.oo, 1),
    "reverse_kl": (1, -1, 2, 1, sp.oo),
    "tv": (0, 0, 0, sp.Rational(1, 2), sp.Rational(1, 2)),
    "pearson": (2, 0, 0, 1, sp.oo),
    "neyman": (2, -6, 24, sp.oo, 1),
    "hellinger": (sp.Rational(1, 2), -sp.Rational(3, 4), sp.Rational(15, 8), 1, 1),
    "lecam": (1, -sp.Rational(3, 2), 3, 1, 1),
    "js": (sp.Rational(1, 4), -sp.Rational(3, 8), sp.Rational(7, 8), sp.log(2) / 2, sp.log(2) / 2),
    "alpha": (1, 1, 0, sp.Rational(1, 3), sp.oo),  # α = 3: f''' = α - 2, f'''' = (α - 2)(α - 3)
}


@pytest.mark.parametrize("name", sorted(FACTS))
def test_computed_facts(name):
    div = facts(get_divergence(name))
    f2, f3, f4, f0, slope = FACTS[name]
    assert div.derivatives_at_one == (f2, f3, f4)
    assert sp.simplify(div.f_at_zero - f0) == 0 if f0 != sp.oo else div.f_at_zero == sp.oo
    assert div.slope_at_infinity == slope if slope == sp.oo else sp.simplify(div.slope_at_infinity - slope) == 0
    assert div.is_smooth_at_one == (name != "tv")
    # the normalised generator is >= 0 with its minimum 0 at u = 1
    assert div.f_normalised.subs(U, 1) == 0
    assert all(float(div.f_normalised.subs(U, x)) >= 0 for x in (1e-3, 0.5, 0.99, 1.01, 2, 1e3))


# ---------------------------------------------------------------------------------------------- parser

REFUSED = {
    "attribute access": ("u.real", "not allowed in a generator (Attribute)"),
    "dunder attribute": ("u.__class__", "not allowed in a generator (Attribute)"),
    "dunder name": ("__builtins__", "unknown name '__builtins__'"),
    "call outside the whitelist": ("sin(u)", "call 'sin(u)' is not allowed; allowed functions"),
    "import call": ("__import__('os')", "__import__('os')\" is not allowed"),
    "lambda": ("lambda u: u", "(Lambda)"),
    "called lambda": ("(lambda: u)()", "is not allowed"),
    "subscript": ("u[0]", "(Subscript)"),
    "string": ("'u'", "only numbers are allowed as constants"),
    "f-string": ("f'{u}'", "(JoinedStr)"),
    "keyword argument": ("log(u, base=2)", "keyword and starred arguments are not allowed"),
    "two arguments": ("log(u, 2)", "takes exactly one argument"),
    "conditional": ("u if u else 1", "(IfExp)"),
    "list": ("[u]", "(List)"),
    "huge power": ("u**100", "(|exponent| <= 64)"),
    "tower of powers": ("9**9**9", "too large"),
    "huge literal": ("u + 10**7 * 0 + 12345678", "outside 1e-40 <= |x| <= 1e6"),
    "other variable": ("x**2", "unknown name 'x'"),
    "too long": ("u+" * 300 + "u", "characters long"),
    "syntax error": ("(u-1", "not a valid expression"),
    "deep nesting": ("-(" * 70 + "u" + ")" * 70, "nested too deeply"),
    "transcendental tower": ("exp(exp(exp(exp(u))))", "nests transcendental functions"),
    "too many nodes": ("+".join(["u"] * 150), "too large"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_parser_refuses(case):
    text, message = REFUSED[case]
    with pytest.raises(GeneratorError) as info:
        Divergence.from_expression(text)
    assert message in str(info.value)


def test_parser_accepts_the_whitelist():
    f = to_sympy(parse("abs(u-1)/2 + ln(u)**2 + exp(u) + cbrt(u) + sqrt(u) + Abs(u) + pi*E + 2^3 - 1.5e2"))
    assert f.has(sp.Abs, sp.log, sp.exp)
    assert to_sympy(parse("(sqrt(u)-1)**2")) == (sp.sqrt(U) - 1) ** 2


def test_no_code_runs(tmp_path):
    """Strings that would write a file or set a global if evaluated are refused, and nothing happened."""
    target = tmp_path / "pwned"
    attacks = [
        f"open({str(target)!r}, 'w').write('x')",
        f"__import__('pathlib').Path({str(target)!r}).touch()",
        "globals().__setitem__('PWNED', 1)",
        "setattr(__builtins__, 'PWNED', 1)",
        "[x for x in ().__class__.__base__.__subclasses__()]",
        "exec('PWNED = 1')",
        "(lambda: __import__('os').system('touch pwned'))()",
    ]
    for attack in attacks:
        with pytest.raises(GeneratorError):
            Divergence.from_expression(attack)
    assert not target.exists()
    assert "PWNED" not in globals()
    assert not hasattr(builtins, "PWNED")


# ---------------------------------------------------------------------------------------------- invalid generators


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("u**2", "f(1) must be 0, got f(1) = 1"),
        ("exp(u)", "f(1) must be 0, got f(1) = 2.71828"),
        ("1-u**2", "f is not convex on (0, inf)"),  # concave, f(1) = 0
        ("-u**2+1", "f is not convex on (0, inf)"),
        ("sqrt(u)-1", "f is not convex on (0, inf)"),  # concave, f(1) = 0
        ("log(u)", "f is not convex on (0, inf)"),  # concave, f(1) = 0
        ("(u-1)**3", "f is not convex on (0, inf)"),  # inflection at 1
    ],
)
def test_invalid_generators_refused(text, message):
    with pytest.raises(GeneratorError) as info:
        Divergence.from_expression(text)
    assert message in str(info.value)
    assert to_text(parse(text)) in str(info.value)  # the message names the generator (canonical spelling)


def test_valid_user_generator():
    div = Divergence.from_expression("(u-1)**2 + (sqrt(u)-1)**2", name="mix")
    assert div.name == "mix"
    assert facts(div).f2 == sp.Rational(5, 2)
    assert facts(div).f_at_zero == 2


def test_sympy_expression_with_foreign_symbol_refused():
    x = sp.Symbol("x")
    with pytest.raises(GeneratorError, match="may only depend on u"):
        Divergence.from_expression(x * U - x)


# ---------------------------------------------------------------------------------------------- one grammar

FORMULAS = [
    "(u-1)**2",
    "u*log(u) - u + 1",
    "(sqrt(u) - 1)^2",
    "-log(u) + u - 1",
    "abs(u - 1)/2",
    "(u-1)**2/(u+1)",
    "2*(u-1)**2 + 0.5*(u-1)**4",
    "cosh(u - 1) - 1",
    "max(u - 1, 0)**2 + (u - 1)**2",
    "u**(1/3)*3 - 3 - (u - 1)",
    "exp(u - 1) - u",
    "-(-(u - 1))**2",
    "1e-3*(u-1)**2",
    "(u - 1)**2/u + 1/2*(u - 1)**2",
]
SPELLINGS = [
    *list_divergences(),
    "bandkl",
    "bandtv",
    "BANDCHI2",
    "alpha(0.5)",
    "alpha(-1)",
    "alpha( 2 )",
    "alpha(alpha=3)",
    *FORMULAS[:4],
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_round_trips(spelling):
    d = resolve(spelling)
    assert resolve(d.spelling) == d
    assert resolve(d) is d
    assert resolve(d.name) == d if d.is_catalogue else resolve(d.formula) == d
    assert get_divergence is resolve


@pytest.mark.parametrize("text", FORMULAS)
def test_canonical_spelling_is_idempotent(text):
    once = to_text(parse(text))
    assert to_text(parse(once)) == once
    assert parse(once) == parse(text)


def test_formula_and_name_of_the_same_generator_agree_numerically():
    import numpy as np

    from bandcore.divergences.checks import numpy_namespace
    from bandcore.divergences.grammar import evaluate

    grid = np.array([1e-3, 0.3, 1.0, 2.5, 40.0])
    for name in ("kl", "hellinger", "js", "alpha(0.5)"):
        d = resolve(name)
        via_formula = resolve(d.formula)
        np.testing.assert_allclose(
            evaluate(via_formula.tree, numpy_namespace(), grid), evaluate(d.tree, numpy_namespace(), grid), rtol=1e-15
        )


class _Sentinel:
    """Records any attempt to turn it into text or a number (evaluation of a non-string input)."""

    calls: ClassVar[list[str]] = []

    def __str__(self) -> str:
        self.calls.append("str")
        return "u**2 - 2*u + 1"

    def __repr__(self) -> str:
        self.calls.append("repr")
        return "(u-1)**2"

    def __format__(self, spec: str) -> str:
        self.calls.append("format")
        return "(u-1)**2"

    def __float__(self) -> float:
        self.calls.append("float")
        return 1.0

    def __index__(self) -> int:
        self.calls.append("index")
        return 1


@pytest.mark.parametrize(
    "value",
    [["kl"], ("kl",), {"kl": 1}, {"kl"}, b"kl", b"(u-1)**2", 3, 2.5, None, object(), _Sentinel()],
    ids=["list", "tuple", "dict", "set", "bytes", "bytes-formula", "int", "float", "None", "object", "sentinel"],
)
def test_non_string_spellings_are_refused_without_evaluation(value):
    _Sentinel.calls.clear()
    with pytest.raises(TypeError, match="divergence must be a name"):
        resolve(value)
    with pytest.raises(TypeError):
        parse(value)
    with pytest.raises(TypeError):
        Divergence.from_expression(value)
    assert _Sentinel.calls == []  # nothing looked at the object's text


INJECTIONS = [
    "__import__('os').system('touch {target}')",
    "open('{target}', 'w').write('x')",
    "u.__class__.__mro__[1].__subclasses__()",
    "(lambda: open('{target}', 'w'))()",
    "[open('{target}', 'w') for u in (1,)]",
    "{{u: open('{target}', 'w')}}",
    "u if open('{target}', 'w') else u",
    "log(u).__globals__",
    "exp(u)(open('{target}', 'w'))",
    "getattr(u, 'real')",
    "eval('1')",
    "(u := 2)",
    "u; import os",
    "await u",
    "u[open('{target}', 'w')]",
    "alpha(__import__('os').system('touch {target}'))",
]


@pytest.mark.parametrize("template", INJECTIONS)
def test_no_code_runs_for_injection_strings(template, tmp_path):
    target = tmp_path / "pwned"
    text = template.format(target=target)
    with pytest.raises((GeneratorError, ValueError)):
        resolve(text)
    with pytest.raises(GeneratorError):
        parse(text)
    assert not target.exists()
    assert not hasattr(builtins, "PWNED")

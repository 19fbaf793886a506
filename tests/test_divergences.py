"""The catalogue, the computed facts of each generator, and the safe parser (refusals, no code run)."""

from __future__ import annotations

import builtins

import pytest
import sympy as sp

import bandcore as bc
from bandcore.divergences import Divergence, GeneratorError, U, get_divergence, list_divergences, parse_generator

# ---------------------------------------------------------------------------------------------- catalogue


def test_catalogue_names():
    assert list_divergences() == ["kl", "reverse_kl", "tv", "pearson", "neyman", "hellinger", "lecam", "js", "alpha"]
    assert bc.list_divergences() == list_divergences()


@pytest.mark.parametrize(("alias", "name"), [("bandkl", "kl"), ("bandtv", "tv"), ("bandchi2", "pearson")])
def test_aliases(alias, name):
    assert get_divergence(alias) == get_divergence(name)
    assert get_divergence(alias.upper()).name == name


def test_alpha_parameter():
    assert get_divergence("alpha").name == "alpha(3)"
    a = get_divergence("alpha", alpha=0.5)
    assert a.name == "alpha(0.5)" and a.params == (("alpha", 0.5),)
    assert sp.simplify(a.f - (U**sp.Rational(1, 2) - 1 - (U - 1) / 2) / (sp.Rational(1, 2) * sp.Rational(-1, 2))) == 0
    assert sp.simplify(get_divergence("alpha", alpha=2.0).f - (U - 1) ** 2 / 2) == 0  # Pearson/2
    assert sp.simplify(get_divergence("alpha", alpha=0.0).f - (-sp.log(U) + U - 1)) == 0  # KL limit
    assert sp.simplify(get_divergence("alpha", alpha=1.0).f - (U * sp.log(U) - U + 1)) == 0  # reverse-KL limit


def test_unknown_names_and_parameters():
    with pytest.raises(ValueError, match=r"unknown divergence 'klx'.*valid names: kl"):
        get_divergence("klx")
    with pytest.raises(TypeError, match="unknown parameter"):
        get_divergence("alpha", beta=1.0)
    with pytest.raises(TypeError, match="takes no parameters"):
        get_divergence("kl", alpha=2.0)
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        get_divergence("alpha", alpha=float("nan"))


# (f''(1), f'''(1), f''''(1), f̃(0), lim f̃(u)/u): known values for each generator (MATH.md §1, §3)
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
    div = get_divergence(name)
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
    "keyword argument": ("log(u, base=2)", "takes exactly one positional argument"),
    "conditional": ("u if u else 1", "(IfExp)"),
    "list": ("[u]", "(List)"),
    "huge power": ("u**100", "too large (|exponent| <= 64)"),
    "tower of powers": ("9**9**9", "too large"),
    "huge literal": ("u + 10**7 * 0 + 12345678", "outside [-1e6, 1e6]"),
    "other variable": ("x**2", "unknown name 'x'"),
    "too long": ("u+" * 300 + "u", "characters long"),
    "syntax error": ("(u-1", "not a valid formula"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_parser_refuses(case):
    text, message = REFUSED[case]
    with pytest.raises(GeneratorError) as info:
        Divergence.from_expression(text)
    assert message in str(info.value)


def test_parser_accepts_the_whitelist():
    f = parse_generator("abs(u-1)/2 + ln(u)**2 + exp(u) + cbrt(u) + sqrt(u) + Abs(u) + pi*E + 2^3 - 1.5e2")
    assert f.has(sp.Abs, sp.log, sp.exp)
    assert parse_generator("(sqrt(u)-1)**2") == (sp.sqrt(U) - 1) ** 2


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
        ("exp(u)", "f(1) must be 0, got f(1) = E"),
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
    assert text in str(info.value)  # the message names the generator


def test_valid_user_generator():
    div = Divergence.from_expression("(u-1)**2 + (sqrt(u)-1)**2", name="mix")
    assert div.name == "mix"
    assert div.f2 == sp.Rational(5, 2)
    assert div.f_at_zero == 2


def test_sympy_expression_with_foreign_symbol_refused():
    x = sp.Symbol("x")
    with pytest.raises(GeneratorError, match="may only depend on u"):
        Divergence.from_expression(x * U - x)

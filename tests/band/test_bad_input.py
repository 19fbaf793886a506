"""Every class of bad input, one row each: the exact error type and a fragment of its message, or the exact
documented result.  Nothing here may run code, hang, or return a silently wrong number."""

from __future__ import annotations

import math
import time
from typing import ClassVar

import numpy as np
import pytest
import torch

import bandcore as bc
from bandcore.cli import main
from bandcore.rl import band_policy_loss

LP = np.log([0.01, 0.3, 0.9])


class Recorder:
    """An object that records any attempt to turn it into text or to call it."""

    touched: ClassVar[list[str]] = []

    def __str__(self) -> str:
        Recorder.touched.append("str")
        return "u"

    def __repr__(self) -> str:
        Recorder.touched.append("repr")
        return "u"

    def __call__(self, *args, **kwargs):
        Recorder.touched.append("call")


def _loss_inputs(**change):
    old = torch.log(torch.tensor([[0.01, 0.3, 0.9], [0.2, 0.5, 0.7]], dtype=torch.float64))
    args = dict(log_prob=old + 0.1, old_log_prob=old, advantages=torch.tensor([1.0, -1.0], dtype=torch.float64),
                mask=torch.ones(2, 3, dtype=torch.float64))
    args.update(change)
    return args


def _loss(**change):
    args = _loss_inputs(**change)
    return band_policy_loss(args["log_prob"], args["old_log_prob"], args["advantages"], args["mask"],
                            **{k: v for k, v in change.items() if k == "log_bounds"})


def _torch_bad(field, transform):
    args = _loss_inputs()
    args[field] = transform(args[field].clone())
    return lambda: band_policy_loss(args["log_prob"], args["old_log_prob"], args["advantages"], args["mask"])


ROWS = [
    # -- 1. expressions are data: non-strings are refused before any parsing ---------------------------------
    ("expr-list", lambda: bc.resolve(["__import__('os').system('true')"]), TypeError, "got list"),
    ("expr-tuple", lambda: bc.resolve(("u",)), TypeError, "got tuple"),
    ("expr-dict", lambda: bc.resolve({"u": 1}), TypeError, "got dict"),
    ("expr-set", lambda: bc.resolve({"u"}), TypeError, "got set"),
    ("expr-bytes", lambda: bc.resolve(b"u**2"), TypeError, "got bytes"),
    ("expr-int", lambda: bc.resolve(2), TypeError, "got int"),
    ("expr-float", lambda: bc.resolve(0.5), TypeError, "got float"),
    ("expr-none", lambda: bc.resolve(None), TypeError, "got NoneType"),
    ("expr-object", lambda: bc.resolve(Recorder()), TypeError, "got Recorder"),
    ("from-expression-list", lambda: bc.Divergence.from_expression(["u"]), TypeError, "got list"),
    ("from-expression-object", lambda: bc.Divergence.from_expression(Recorder()), TypeError, "got Recorder"),
    ("band-divergence-list", lambda: bc.band_log(LP, ["kl"], 0.05), TypeError, "divergence must be"),
    ("derive-divergence-dict", lambda: bc.derive({"f": "u"}), TypeError, "got dict"),
    # -- injection strings are refused by the whitelist ------------------------------------------------------
    ("inject-import", lambda: bc.resolve("__import__('os').system('echo pwned')"), bc.GeneratorError, "not allowed"),
    ("inject-attribute", lambda: bc.resolve("u.__class__"), bc.GeneratorError, "not allowed"),
    ("inject-lambda", lambda: bc.resolve("(lambda: 0)() + u"), bc.GeneratorError, "not allowed"),
    ("inject-comprehension", lambda: bc.resolve("[u for u in ()]"), bc.GeneratorError, "not allowed"),
    ("inject-subscript", lambda: bc.resolve("u[0]"), bc.GeneratorError, "not allowed"),
    ("inject-string", lambda: bc.resolve("'u' + u"), bc.GeneratorError, "only numbers"),
    ("inject-keyword", lambda: bc.resolve("log(x=u)"), bc.GeneratorError, "keyword"),
    ("inject-name", lambda: bc.resolve("os + u"), bc.GeneratorError, "unknown name 'os'"),
    # -- resource limits -------------------------------------------------------------------------------------
    ("size-length", lambda: bc.resolve("u+" * 300 + "u"), bc.GeneratorError, "at most 400"),
    ("size-nodes", lambda: bc.resolve("+".join(["(u-1)**2"] * 40)), bc.GeneratorError, "too large"),
    ("size-depth", lambda: bc.resolve("-" * 200 + "(u-1)**2"), bc.GeneratorError, "nested too deeply"),
    ("size-deep-calls", lambda: bc.resolve("abs(" * 66 + "u" + ")" * 66), bc.GeneratorError, "nested too deeply"),
    ("size-power-tower", lambda: bc.resolve("9**9**9 + (u-1)**2"), bc.GeneratorError, "exponent"),
    ("size-huge-exponent", lambda: bc.resolve("(u-1)**100000"), bc.GeneratorError, "exponent"),
    ("size-huge-constant", lambda: bc.resolve("1e300*(u-1)**2"), bc.GeneratorError, "outside 1e-40"),
    ("size-huge-integer", lambda: bc.resolve("9" * 60 + "*(u-1)**2"), bc.GeneratorError, "too many digits"),
    ("size-exp-tower", lambda: bc.resolve("exp(exp(exp(exp(u))))"), bc.GeneratorError, "transcendental"),
    ("size-constant-overflow", lambda: bc.resolve("10.0**400 * (u-1)**2"), bc.GeneratorError, "exponent"),
    # -- degenerate generators -------------------------------------------------------------------------------
    ("degenerate-zero", lambda: bc.resolve("0*u"), bc.GeneratorError, "affine"),
    ("degenerate-affine", lambda: bc.resolve("3*(u - 1)"), bc.GeneratorError, "affine"),
    ("degenerate-affine-scaled", lambda: bc.resolve("1e-12*(u - 1)"), bc.GeneratorError, "affine"),
    ("degenerate-f1", lambda: bc.resolve("(u-1)**2 + 1"), bc.GeneratorError, "f(1) must be 0"),
    ("degenerate-exp", lambda: bc.resolve("exp(u)"), bc.GeneratorError, "f(1) must be 0"),
    ("degenerate-concave", lambda: bc.resolve("log(u)"), bc.GeneratorError, "not convex"),
    ("degenerate-cubic", lambda: bc.resolve("(u-1)**3"), bc.GeneratorError, "not convex"),
    ("degenerate-complex", lambda: bc.resolve("sqrt(u - 2)*0 + (u-1)**2"), bc.GeneratorError, "finite and real"),
    ("degenerate-constant-zero-division", lambda: bc.resolve("1/(1-1) + (u-1)**2"), bc.GeneratorError,
     "finite and real"),
    ("unknown-name", lambda: bc.resolve("kll"), ValueError, "valid names"),
    ("alpha-not-number", lambda: bc.resolve("alpha(x)"), ValueError, "alpha(a)"),
    ("alpha-too-large", lambda: bc.resolve("alpha(100)"), ValueError, "|alpha| <= 64"),
    ("alpha-bool", lambda: bc.get_divergence("alpha", alpha=True), TypeError, "alpha must be a real number"),
    # -- 3. numbers: arguments of band / band_log ------------------------------------------------------------
    ("delta-nan", lambda: bc.band_log(LP, "kl", math.nan), ValueError, "delta must be finite"),
    ("delta-negative", lambda: bc.band_log(LP, "kl", -0.1), ValueError, "0 < delta"),
    ("delta-zero", lambda: bc.band_log(LP, "kl", 0.0), ValueError, "0 < delta"),
    ("delta-inf", lambda: bc.band_log(LP, "kl", math.inf), ValueError, "delta must be finite"),
    ("delta-huge", lambda: bc.band_log(LP, "kl", 1e4), ValueError, "delta <= 1000"),
    ("delta-string", lambda: bc.band_log(LP, "kl", "0.05"), TypeError, "delta must be a real number"),
    ("delta-bool", lambda: bc.band_log(LP, "kl", True), TypeError, "delta must be a real number"),
    ("delta-array", lambda: bc.band_log(LP, "kl", np.array([0.05, 0.1])), TypeError, "delta must be a real"),
    ("log-p-positive", lambda: bc.band_log(np.array([-0.1, 5.0]), "kl", 0.05), ValueError, "must be <= 0"),
    ("log-p-int", lambda: bc.band_log(np.array([-1, -2]), "kl", 0.05), TypeError, "floating-point"),
    ("log-p-bool", lambda: bc.band_log(np.array([True]), "kl", 0.05), TypeError, "floating-point"),
    ("log-p-complex", lambda: bc.band_log(np.array([-1 + 0j]), "kl", 0.05), TypeError, "floating-point"),
    ("log-p-string", lambda: bc.band_log("-0.5", "kl", 0.05), TypeError, "old_log_prob"),
    ("log-p-object", lambda: bc.band_log(np.array([Recorder()]), "kl", 0.05), TypeError, "old_log_prob"),
    ("log-p-tensor-int", lambda: bc.band_log(torch.tensor([-1, -2]), "kl", 0.05), TypeError, "floating-point"),
    ("log-p-tensor-positive", lambda: bc.band_log(torch.tensor([0.5]), "kl", 0.05), ValueError, "must be <= 0"),
    ("backend-unknown", lambda: bc.band_log(LP, "kl", 0.05, backend="gpu"), ValueError, "backend must be one of"),
    ("backend-type", lambda: bc.band_log(LP, "kl", 0.05, backend=1), ValueError, "backend must be one of"),
    # -- 4. the loss -------------------------------------------------------------------------------------------
    ("loss-shape", lambda: _loss(old_log_prob=torch.zeros(3, 2, dtype=torch.float64)), ValueError, "shape"),
    ("loss-old-positive", _torch_bad("old_log_prob", lambda t: t.fill_(5.0)), ValueError, "old_log_prob"),
    ("loss-mask-nan", _torch_bad("mask", lambda t: t.fill_(math.nan)), ValueError, "mask must not hold NaN"),
    ("loss-mask-negative", _torch_bad("mask", lambda t: t.fill_(-1.0)), ValueError, "mask must be >= 0"),
    ("loss-advantage-nan", _torch_bad("advantages", lambda t: t.fill_(math.nan)), ValueError, "advantages"),
    ("loss-bounds-crossed", lambda: _loss(log_bounds=(torch.full((2, 3), 0.5, dtype=torch.float64),
                                                       torch.full((2, 3), -0.5, dtype=torch.float64))),
     ValueError, "lower <= upper"),
    ("loss-bounds-shape", lambda: _loss(log_bounds=(torch.zeros(3, dtype=torch.float64),
                                                     torch.zeros(3, dtype=torch.float64))), ValueError, "shape"),
    ("loss-bounds-type", lambda: _loss(log_bounds="bounds"), TypeError, "log_bounds must be a pair"),
]


@pytest.mark.parametrize(("call", "error", "fragment"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_bad_input_is_refused(call, error, fragment):
    Recorder.touched.clear()
    started = time.perf_counter()
    with pytest.raises(error) as info:
        call()
    assert fragment in str(info.value)
    assert "\n" not in str(info.value).strip()  # one line
    assert time.perf_counter() - started < 60  # a hang guard, not a benchmark
    assert not {"call"} & set(Recorder.touched)  # nothing handed in was called


def test_row_count():
    assert len(ROWS) >= 60


# -- documented exact results ----------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["numpy", "numba", "torch"])
def test_documented_results_for_special_log_probs(backend):
    x = np.array([math.nan, 0.0, -math.inf, 5e-7, 2.0])
    if backend == "torch":
        x = torch.from_numpy(x)
    lower, upper, status = bc.band_log(x, "kl", 0.05, backend=backend, check=False, return_status=True)
    lower, upper, status = (np.asarray(v) for v in (lower, upper, status))
    assert np.isnan(lower[0]) and np.isnan(upper[0]) and status[0] == bc.Status.INVALID_INPUT
    assert lower[1] == -0.05 and upper[1] == 0.0 and status[1] == bc.Status.SATURATED  # p = 1: [e^-δ, 1]
    assert lower[2] == -math.inf and upper[2] == math.inf and status[2] == bc.Status.SATURATED  # p = 0
    assert lower[3] == -0.05 and upper[3] == 0.0  # (0, 1e-6] is read as p = 1
    assert np.isnan(lower[4]) and np.isnan(upper[4]) and status[4] == bc.Status.INVALID_INPUT


def test_old_log_prob_minus_inf_in_the_loss_is_finite():
    args = _loss_inputs()
    args["old_log_prob"][0, 1] = -math.inf
    args["log_prob"] = args["log_prob"].clone().requires_grad_(True)
    loss, _ = band_policy_loss(args["log_prob"], args["old_log_prob"], args["advantages"], args["mask"])
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(args["log_prob"].grad).all()
    assert args["log_prob"].grad[0, 1] == 0


CLI_ROWS = [
    (["bounds", "--divergence", "nope"], "unknown divergence"),
    (["bounds", "--p", "0"], "--p"),
    (["bounds", "--p", "nan"], "--p"),
    (["bounds", "--delta", "nan"], "delta"),
    (["bounds", "--divergence", "__import__('os')"], "not allowed"),
    (["derive", "(u-1)**3"], "not convex"),
    (["table", "inspect", "/nonexistent/table.npz"], ""),
    (["bench", "--n", "-5"], "--n"),
    (["train", "--out", "/tmp/bandcore-bad", "--delta", "-1"], "delta"),
]


@pytest.mark.parametrize(("argv", "fragment"), CLI_ROWS, ids=[" ".join(r[0][:2]) for r in CLI_ROWS])
def test_cli_errors_are_one_line(argv, fragment, capsys):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code in (1, 2)
    assert len(err.splitlines()) == 1 and err.startswith(f"bandcore {argv[0]}"), err
    assert "Traceback" not in err and fragment in err

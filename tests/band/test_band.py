"""The public band()/band_log(): array kinds, shapes, dtypes, devices, input checks and named edge cases."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from tiers import sampled

import bandcore as bc
from bandcore._contract import DELTA_MAX, LOG_P_TOLERANCE
from bandcore.cli import main
from bandcore.oracle import band_log_mp

torch = pytest.importorskip("torch")

BACKENDS = ["numpy", "numba", "torch"]


def close(a, b, tol=1e-12):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf where both are the same infinity
        same = (a == b) | (np.abs(a - b) <= tol * np.maximum(1.0, np.abs(b)))
    return bool(np.all(same))


# ---- reference values (checked against 50-digit roots) ----------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_reference_values(backend):
    lower, upper = bc.band(np.log([0.5, 0.08, 0.001]), "kl", 0.05, backend=backend)
    assert close(lower, [0.691515669824154, 0.261695843479393, 7.09902397021046e-23], 1e-13)
    assert close(upper, [1.30848433017585, 2.41055379375736, 53.5480873143005], 1e-13)
    lower, upper = bc.band(np.log([0.08]), "hellinger", 0.05, backend=backend)
    assert close(lower, [0.0490474798726003], 1e-13) and close(upper, [2.9878275201274], 1e-13)
    lower, upper = bc.band(np.log([0.08]), "js", 0.05, backend=backend)
    assert lower[0] == 0.0 and close(upper, [4.0946982543017], 1e-13)


# ---- shapes and dtypes -------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(), (7,), (3, 4)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_shapes_and_dtypes(backend, shape, dtype):
    rng = np.random.default_rng(1)
    x = (-rng.exponential(2.0, shape)).astype(dtype)
    lower, upper = bc.band_log(x, "kl", 0.05, backend=backend)
    assert isinstance(lower, np.ndarray) and lower.shape == shape and lower.dtype == dtype
    assert isinstance(upper, np.ndarray) and upper.shape == shape and upper.dtype == dtype
    # computed in fp64 from the input's values, rounded once
    ref_lower, ref_upper = bc.band_log(x.astype(np.float64), "kl", 0.05, backend=backend)
    assert np.array_equal(lower, ref_lower.astype(dtype)) and np.array_equal(upper, ref_upper.astype(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(), (7,), (3, 4)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_torch_shapes_dtypes_and_no_grad(backend, shape, dtype):
    dtype = getattr(torch, dtype)
    x = (-torch.rand(shape, dtype=torch.float64) * 5).to(dtype).requires_grad_(True)
    lower, upper = bc.band(x, "hellinger", 0.1, backend=backend)
    for out in (lower, upper):
        assert isinstance(out, torch.Tensor) and out.shape == x.shape and out.dtype == dtype
        assert out.device == x.device and not out.requires_grad and out.grad_fn is None
    reference = bc.band(x.detach().double(), "hellinger", 0.1, backend=backend)
    for out, ref in zip((lower, upper), reference, strict=True):
        assert torch.equal(out, ref.to(dtype))  # rounded once from fp64


def test_python_float_and_list():
    lower, upper = bc.band_log(-0.3, "kl", 0.05)
    assert isinstance(lower, np.ndarray) and lower.shape == () and lower.dtype == np.float64
    lower_list, upper_list = bc.band_log([-0.3, -2.0], "kl", 0.05)
    assert lower_list.shape == (2,) and lower_list[0] == lower and upper_list[0] == upper


def test_band_is_exp_of_band_log():
    x = np.array([-0.01, -1.0, -9.0])
    lower, upper = bc.band(x, "reverse_kl", 0.2, backend="numpy")  # one binding: "auto" may pick Numba for one
    log_lower, log_upper = bc.band_log(x, "reverse_kl", 0.2, backend="numpy")  # output and not for the other
    assert np.array_equal(lower, np.exp(log_lower)) and np.array_equal(upper, np.exp(log_upper))


def test_auto_backend():
    from bandcore.band import AUTO_NUMBA_MIN_SIZE

    x = np.array([-0.5, -2.0])
    small = bc.bind("kl", 0.05).pick(x.size)  # numpy, or numba once its kernel is ready (tests/band/test_auto_backend)
    assert small in ("numpy", "numba")
    assert all(np.array_equal(a, b) for a, b in zip(bc.band_log(x), bc.band_log(x, backend=small), strict=True))
    big = np.full(AUTO_NUMBA_MIN_SIZE, -0.5)
    assert all(np.array_equal(a, b) for a, b in zip(bc.band_log(big), bc.band_log(big, backend="numba"), strict=True))
    t = torch.tensor([-0.5, -2.0])
    assert isinstance(bc.band_log(t)[0], torch.Tensor)  # CPU tensors go to the CPU solvers, torch out
    small = bc.bind("kl", 0.05).pick(t.numel())
    assert all(torch.equal(a, b) for a, b in zip(bc.band_log(t), bc.band_log(t, backend=small), strict=True))


def test_divergence_object_alias_and_user():
    x = np.array([-0.2, -3.0])
    by_alias = bc.band_log(x, "bandkl", 0.05)
    by_object = bc.band_log(x, bc.get_divergence("kl"), 0.05)
    assert all(np.array_equal(a, b) for a, b in zip(by_alias, by_object, strict=True))
    mine = bc.Divergence.from_expression("-log(u)", name="my-kl")
    assert all(close(a, b, 1e-14) for a, b in zip(bc.band_log(x, mine, 0.05), by_alias, strict=True))


@pytest.mark.parametrize("backend", BACKENDS)
def test_user_divergence_without_closed_form(backend):
    div = bc.Divergence.from_expression("u*log(u) - log(u) + (u-1)**2", name="mixed")
    x = np.array([-4.0, -0.7, -1e-4])
    lower, upper = bc.band_log(x, div, 0.1, backend=backend)
    for i, lp in enumerate(x):
        ref_lower, ref_upper = band_log_mp(div, lp, 0.1)
        assert abs(lower[i] - float(ref_lower)) <= 1e-12 * max(1, abs(float(ref_lower)))
        assert abs(upper[i] - float(ref_upper)) <= 1e-12 * max(1, abs(float(ref_upper)))


# ---- named edge cases --------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_saturated_upper_is_exactly_one_over_p(backend):
    # TV saturates above iff p >= 1 - delta; Pearson iff p >= 1/(1 + delta)
    x = np.log(np.array([0.96, 0.99, 0.999999]))
    _, log_upper = bc.band_log(x, "tv", 0.05, backend=backend)
    assert np.array_equal(log_upper, -x)
    _, upper = bc.band(x, "pearson", 0.5, backend=backend)
    assert np.array_equal(upper, np.exp(-x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_saturated_lower_is_zero(backend):
    x = np.log(np.array([0.01, 0.04]))
    log_lower, _ = bc.band_log(x, "tv", 0.05, backend=backend)
    assert np.all(log_lower == -np.inf)
    lower, _ = bc.band(x, "js", 0.5, backend=backend)
    assert np.all(lower == 0.0)


P_ONE = {  # divergence -> r_lo at p = 1 as a function of delta (module docstring of bandcore.band)
    "kl": lambda d: math.exp(-d),
    "tv": lambda d: 1 - d,
    "pearson": lambda d: 1.0,
    "neyman": lambda d: 1 / (1 + d),
    "hellinger": lambda d: (1 - d / 2) ** 2,
    "lecam": lambda d: (2 - d) / (2 + d),
    "reverse_kl": lambda d: 1.0,
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", [*P_ONE, "js"])
def test_p_equal_one(backend, name):
    lower, upper = bc.band(np.zeros(3), name, 0.3, backend=backend)
    assert np.all(upper == 1.0)
    expected = P_ONE[name](0.3) if name in P_ONE else math.exp(float(band_log_mp(name, 0, 0.3)[0]))
    assert close(lower, expected, 1e-13)
    assert close(bc.band_log(np.zeros(1), name, 0.3, backend=backend)[0], float(band_log_mp(name, 0, 0.3)[0]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_p_one_saturated_lower(backend):
    assert bc.band(np.zeros(1), "tv", 1.5, backend=backend)[0][0] == 0.0  # 1 - delta < 0: saturated


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_p_minus_700(backend):
    lower, upper = bc.band_log(np.array([-700.0]), "kl", 0.05, backend=backend)
    ref_lower, ref_upper = band_log_mp("kl", -700, 0.05)
    assert ref_lower < -1e300  # e^{-1-delta/p}: representable only as a log
    assert close(lower, float(ref_lower)) and close(upper, float(ref_upper))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("delta", [1e-8, 10.0])
def test_delta_extremes(backend, delta):
    x = np.array([-30.0, -0.7, -1e-6])
    lower, upper = bc.band_log(x, "neyman", delta, backend=backend)
    for i, lp in enumerate(x):
        ref_lower, ref_upper = band_log_mp("neyman", lp, delta)
        assert close(lower[i], float(ref_lower)) and close(upper[i], float(ref_upper))


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_nan_out(backend):
    x = np.array([np.nan, -0.5, np.nan])
    lower, upper = bc.band_log(x, "kl", 0.05, backend=backend)
    assert np.isnan(lower[[0, 2]]).all() and np.isnan(upper[[0, 2]]).all()
    assert np.isfinite(lower[1]) and np.isfinite(upper[1])
    t_lower, t_upper = bc.band_log(torch.tensor(x), "kl", 0.05, backend=backend)
    assert torch.isnan(t_lower[[0, 2]]).all() and torch.isnan(t_upper[[0, 2]]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_p_minus_inf(backend):
    lower, upper = bc.band(np.array([-np.inf]), "kl", 0.05, backend=backend)
    assert lower[0] == 0.0 and upper[0] == np.inf


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), -float("inf"), 2 * DELTA_MAX])
def test_bad_delta(bad):
    with pytest.raises(ValueError, match="delta") as info:
        bc.band_log(np.array([-0.5]), "kl", bad)
    assert repr(float(bad)) in str(info.value)


@pytest.mark.parametrize("bad", ["0.05", None, [0.05]])
def test_delta_of_wrong_type(bad):
    with pytest.raises(TypeError, match="delta"):
        bc.band_log(np.array([-0.5]), "kl", bad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_log_p_above_zero(backend):
    with pytest.raises(ValueError, match="old_log_prob") as info:
        bc.band_log(np.array([-0.5, 0.25]), "kl", 0.05, backend=backend)
    assert "0.25" in str(info.value)
    with pytest.raises(ValueError, match="old_log_prob"):
        bc.band_log(torch.tensor([0.25]), "kl", 0.05, backend=backend)
    # within the tolerance: read as p = 1
    lower, upper = bc.band_log(np.array([LOG_P_TOLERANCE / 2, 0.0]), "kl", 0.05, backend=backend)
    assert lower[0] == lower[1] and upper[0] == upper[1] == 0.0
    # check=False: the kernels give NaN
    lower, upper = bc.band_log(np.array([0.25, -0.5]), "kl", 0.05, backend=backend, check=False)
    assert np.isnan(lower[0]) and np.isnan(upper[0]) and np.isfinite(upper[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty(backend):
    lower, upper = bc.band_log(np.zeros((0, 3), dtype=np.float32), "kl", 0.05, backend=backend)
    assert lower.shape == upper.shape == (0, 3) and lower.dtype == np.float32
    t_lower, _ = bc.band_log(torch.zeros(0), "kl", 0.05, backend=backend)
    assert t_lower.shape == (0,)


def test_integer_dtype_is_refused():
    with pytest.raises(TypeError, match="old_log_prob"):
        bc.band_log(np.array([-1, -2]), "kl", 0.05)
    with pytest.raises(TypeError, match="old_log_prob"):
        bc.band_log(torch.tensor([-1, -2]), "kl", 0.05)
    with pytest.raises(TypeError, match="old_log_prob"):
        bc.band_log(np.array([True]), "kl", 0.05)


def test_unknown_divergence_and_backend():
    with pytest.raises(ValueError, match="unknown divergence 'nope'"):
        bc.band_log(np.array([-0.5]), "nope", 0.05)
    with pytest.raises(ValueError, match="backend"):
        bc.band_log(np.array([-0.5]), "kl", 0.05, backend="gpu")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own
def test_torch_compile():
    from bandcore.band import torch_function

    # fullgraph: no graph break, so no host synchronisation; "eager" skips inductor's (minutes-long) CPU codegen
    x = torch.tensor([-0.01, -2.0, -50.0, 0.0], dtype=torch.float64)
    for name in ("kl", "hellinger", "tv"):
        compiled = torch.compile(torch_function(name, 0.05), backend="eager", dynamic=False, fullgraph=True)
        lower, upper, _ = compiled(x)
        ref_lower, ref_upper = bc.band_log(x.numpy(), name, 0.05, backend="numpy")
        assert close(lower.numpy(), ref_lower, 1e-13) and close(upper.numpy(), ref_upper, 1e-13)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # torch's own
def test_torch_compile_sees_the_safeguarded_solver_as_one_operator():
    """Traced, the safeguarded solver's fixed-length loop of a generic plan unrolled into 66,402 graph nodes (over
    a minute of tracing); it is one opaque operator, the graph a few hundred nodes, and both the compiled function
    and the operator alone match NumPy on a wide grid."""
    from bandcore.band import BoundBand, torch_function
    from bandcore.kernels.opaque import safeguarded_band

    graphs = []

    def keep(graph_module, inputs):
        graphs.append(graph_module)
        return graph_module.forward

    x = torch.from_numpy(-np.exp(np.linspace(-40.0, 6.5, 301)))
    compiled = torch.compile(torch_function("hellinger", 0.05), backend=keep, dynamic=False, fullgraph=True)
    lower, upper, _ = compiled(x)
    targets = [node.target for node in graphs[0].graph.nodes]
    assert torch.ops.bandcore.safeguarded_band in targets and len(targets) < 2000, len(targets)
    ref_lower, ref_upper = bc.band_log(x.numpy(), "hellinger", 0.05, backend="numpy")
    assert close(lower.numpy(), ref_lower, 1e-13) and close(upper.numpy(), ref_upper, 1e-13)
    solver = BoundBand("hellinger", 0.05, backend="torch").solver("torch", "cpu")
    alone_lower, alone_upper, _ = safeguarded_band(x, solver._opaque)
    assert close(alone_lower.numpy(), ref_lower, 1e-13) and close(alone_upper.numpy(), ref_upper, 1e-13)


# ---- `bandcore bounds` -------------------------------------------------------------------------------------


def test_bounds_cli(capsys):
    assert main(["bounds", "--divergence", "kl", "--delta", "0.05", "--p", "0.08", "0.5", "0.99"]) == 0
    out = capsys.readouterr().out
    lines = [line.split() for line in out.strip().splitlines()[2:]]
    assert [float(row[0]) for row in lines] == [0.08, 0.5, 0.99]
    lower, upper = bc.band(np.log([0.08, 0.5, 0.99]), "kl", 0.05)
    assert close([float(row[1]) for row in lines], lower, 1e-5)
    assert close([float(row[2]) for row in lines], upper, 1e-5)
    assert float(lines[0][5]) == 0.8 and float(lines[0][6]) == 1.2  # PPO's clip for comparison


def test_bounds_cli_errors(capsys):
    assert main(["bounds", "--p", "1.5"]) == 2
    assert "--p" in capsys.readouterr().err
    assert main(["bounds", "--divergence", "__import__('os')"]) == 2


# ---- TV and Pearson: the ratios computed directly (no exp of a log bound) -------------------------------------

def _ratio_points(delta: float) -> np.ndarray:
    rng = np.random.default_rng(7)
    spread = -np.exp(rng.uniform(-40.0, 7.0, 120))  # log p from -4e-18 to -1100
    far = [-700.0, -708.5, -709.9, -745.2, -1419.5, -1419.7, -1422.0, -1e4, -1e-300]
    thresholds = [math.log(delta), math.log1p(-delta) if delta < 1 else -1.0, -math.log1p(delta),
                  math.log(delta / (1 + delta))]  # TV's and Pearson's saturation thresholds
    away = [t * (1 + s) for t in thresholds for s in (1e-3, -1e-3, 0.3, -0.3)]
    return np.array([x for x in [*spread, *far, *away] if x < 0])


@functools.cache
def _exact_log_ratios(name: str, delta: float) -> list:
    """The 40-digit (log r_lo, log r_up) at :func:`_ratio_points`, once per process for every backend."""
    return [band_log_mp(name, lp, delta, dps=40) for lp in _ratio_points(delta).tolist()]


@pytest.mark.parametrize("name", ["kl", "js", "alpha(0.5)", "alpha(0.7)", "cosh(u-1) - 1"])
@pytest.mark.parametrize("delta", sampled([1e-8, 0.05, 3.0], fast=[0.05]))
def test_seeded_ratios_against_the_oracle(name, delta):
    """band() on Numba forms the seeded kinds' ratios themselves (the seed's point corrected by the Taylor
    polynomial of its step, not exp of a log bound): every ratio within 1e-12 max(1, |log r|) relatively of the
    40-digit one, a subnormal or zero one within one subnormal spacing more; the float32 output is the float64
    one rounded."""
    import mpmath as mp

    x = _ratio_points(delta)
    exact_pairs = _exact_log_ratios(name, delta)
    x32 = x.astype(np.float32)
    for index, (got, got32) in enumerate(zip(bc.band(x, name, delta, backend="numba"),
                                             bc.band(x32, name, delta, backend="numba"), strict=True)):  # fmt: skip
        for value, lp, exact_logs in zip(got.tolist(), x.tolist(), exact_pairs, strict=True):
            exact_log = exact_logs[index]
            exact = mp.e**exact_log if mp.isfinite(exact_log) else (mp.inf if exact_log > 0 else mp.mpf(0))
            if exact > mp.mpf("1.7976931348623157e308"):
                assert value == math.inf, (name, delta, lp, index, value, exact)
                continue
            scale = max(1.0, abs(float(exact_log))) if mp.isfinite(exact_log) else 1.0
            slack = 5e-324 if exact < mp.mpf("2.2250738585072014e-308") else 0.0
            assert abs(mp.mpf(value) - exact) <= 1e-12 * scale * exact + slack, (name, delta, lp, index, value, exact)
        with np.errstate(over="ignore"):  # float32 inf where the float64 ratio is above its range
            reference = bc.band(x32.astype(np.float64), name, delta, backend="numba")[index].astype(np.float32)
        assert np.array_equal(got32, reference, equal_nan=True), (name, delta, index)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["tv", "pearson"])
@pytest.mark.parametrize("delta", sampled([1e-8, 0.05, 0.999, 3.0], fast=[0.05]))
def test_closed_form_ratios_against_the_oracle(backend, name, delta):
    """band() for TV and Pearson computes r itself (two transcendentals, not exp of a log bound): every ratio
    within 1e-12 max(1, |log r|) relatively of the 50-digit one (0 or inf exactly where it under- or
    overflows), on every backend; the points sit 1e-3 and 30 % away from the saturation thresholds."""
    import mpmath as mp

    x = _ratio_points(delta)
    lower, upper = bc.band(torch.from_numpy(x) if backend == "torch" else x, name, delta, backend=backend)
    for got, index in ((np.asarray(lower), 0), (np.asarray(upper), 1)):
        for value, lp, exact_logs in zip(got.tolist(), x.tolist(), _exact_log_ratios(name, delta), strict=True):
            exact_log = exact_logs[index]
            exact = mp.e**exact_log if mp.isfinite(exact_log) else (mp.inf if exact_log > 0 else mp.mpf(0))
            if exact > mp.mpf("1.7976931348623157e308") or exact < mp.mpf("2.2250738585072014e-308"):
                assert value == float(exact), (name, delta, lp, index, value, exact)  # 0, inf, or subnormal
                continue
            scale = max(1.0, abs(float(exact_log)))
            assert abs(mp.mpf(value) - exact) <= 1e-12 * scale * exact, (name, delta, lp, index, value, exact)


def test_torch_backend_returns_normal_tensors():
    """torch's solver runs in inference mode; what it returns must still work as a clamp's bounds under autograd
    and take in-place updates, for either input dtype."""
    x = torch.log(torch.tensor([0.08, 0.5, 0.99], dtype=torch.float64))
    for dtype in (torch.float32, torch.float64):
        lower, upper, status = bc.band(x.to(dtype), "js", 0.05, backend="torch", return_status=True)
        assert not any(t.is_inference() for t in (lower, upper, status))
        ratio = torch.ones(3, dtype=dtype, requires_grad=True)
        torch.clamp(ratio * 1.5, lower, upper).sum().backward()  # the bounds are saved for backward
        assert ratio.grad.tolist() == [1.5, 1.5, 0.0]  # 1.5 lies inside the Band of p = 0.08 and 0.5 only
        lower.mul_(1.0)
        reference = bc.band(x.numpy(), "js", 0.05, backend="numpy")[0]
        np.testing.assert_allclose(lower.double().numpy(), reference, rtol=1e-6 if dtype == torch.float32 else 1e-12)

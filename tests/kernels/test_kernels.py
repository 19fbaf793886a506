"""Every backend against the 50-digit oracle, plus the Band's properties (hypothesis), per backend.

Contract: |Δ log r| <= 1e-12 · max(1, |log r|) for log p in [-700, 0), δ in [1e-8, 10], every divergence
(catalogue, α-family members, user generators without closed form); saturated bounds exact.
Oracle values are computed once per session (mpmath, ~0.05 s per point).
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bandcore import Divergence, band_log, get_divergence
from bandcore.derive import solver_plan
from bandcore.divergences.catalogue import CATALOGUE as CATALOGUE_ENTRIES
from bandcore.kernels import backends, compiled
from bandcore.kernels.seeds import NO_SEED
from bandcore.oracle import band_log_mp

TOLERANCE = 1e-12

CATALOGUE = list(CATALOGUE_ENTRIES)  # every fixed-formula entry of the catalogue (alpha is tested by value)
ALPHAS = [3.0, 2.0, -1.0, 0.5, -2.0]
USER = ["(u-1)**2 + (sqrt(u)-1)**2", "(u-1)**4", "u*log(u) - log(u)"]


def _divergence(key: str) -> Divergence:
    if key.startswith("alpha="):
        return get_divergence("alpha", alpha=float(key.split("=")[1]))
    if "u" in key and key not in CATALOGUE:
        return Divergence.from_expression(key, name=key)
    return get_divergence(key)


ALL = CATALOGUE + [f"alpha={a:g}" for a in ALPHAS] + USER
#: numba compiles ~2-4 s per divergence: the default run compiles a representative subset, the slow run all
NUMBA_DEFAULT = ["kl", "tv", "js", "alpha=-2", "u*log(u) - log(u)"]

LOG_P = np.array([-700.0, -50.0, -3.0, -0.3, -1e-3, -1e-12, -1e-300])
DELTAS = [1e-8, 0.05, 10.0]
LOG_P_SLOW = np.array([-700.0, -300.0, -60.0, -20.0, -7.0, -2.0, -0.7, -0.1, -1e-2, -1e-5, -1e-9, -1e-16, -1e-200])
DELTAS_SLOW = [1e-8, 1e-5, 1e-2, 0.3, 2.0, 10.0]

_ORACLE: dict[tuple[str, float], tuple[np.ndarray, np.ndarray]] = {}


def oracle(key: str, log_p: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """(log r_lo, log r_up) at 50 digits, as mpf object arrays; cached for the session."""
    cache_key = (key, delta, log_p.tobytes())
    if cache_key not in _ORACLE:
        div = _divergence(key)
        pairs = [band_log_mp(div, float(x), delta) for x in log_p]
        _ORACLE[cache_key] = (
            np.array([lo for lo, _ in pairs], dtype=object),
            np.array([up for _, up in pairs], dtype=object),
        )
    return _ORACLE[cache_key]


def relative_errors(got: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|got - ref| / max(1, |ref|); exact match required where the reference is infinite (saturation)."""
    errors = np.empty(got.shape)
    for i, (g, r) in enumerate(zip(got, reference, strict=True)):
        if mp.isinf(r):
            errors[i] = 0.0 if g == float(r) else np.inf
        else:
            errors[i] = float(abs(mp.mpf(float(g)) - r) / max(1, abs(r))) if np.isfinite(g) else np.inf
    return errors


def check_against_oracle(key: str, backend: str, log_p: np.ndarray, deltas: list[float]) -> float:
    div = _divergence(key)
    worst = 0.0
    for delta in deltas:
        lower, upper = band_log(log_p, div, delta, backend=backend)
        ref_lower, ref_upper = oracle(key, log_p, delta)
        for side, got, ref in (("lower", lower, ref_lower), ("upper", upper, ref_upper)):
            errors = relative_errors(got, ref)
            bad = np.flatnonzero(errors > TOLERANCE)
            assert bad.size == 0, (
                f"{key} {backend} {side} delta={delta}: log p={log_p[bad]} got {got[bad]} "
                f"oracle {[mp.nstr(ref[i], 17) for i in bad]} (errors {errors[bad]})"
            )
            worst = max(worst, float(errors.max()))
    return worst


@pytest.mark.parametrize("key", ALL)
def test_numpy_matches_oracle(key):
    check_against_oracle(key, "numpy", LOG_P, DELTAS)


@pytest.mark.parametrize("key", ALL)
def test_torch_matches_oracle(key):
    pytest.importorskip("torch")
    check_against_oracle(key, "torch", LOG_P, DELTAS)


@pytest.mark.parametrize("key", NUMBA_DEFAULT)
def test_numba_matches_oracle(key):
    check_against_oracle(key, "numba", LOG_P, DELTAS)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "numba", "torch"])
@pytest.mark.parametrize("key", ALL)
def test_backends_match_oracle_on_large_grid(key, backend):
    check_against_oracle(key, backend, LOG_P_SLOW, DELTAS_SLOW)


# ------------------------------------------------------------------------------------------------------------
# Backends agree with each other on many random tokens (cheap: no oracle)
# ------------------------------------------------------------------------------------------------------------


def _llm_like_log_probs(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    head = -rng.exponential(0.05, n // 2)  # most tokens near p = 1
    tail = -rng.exponential(6.0, n - n // 2)  # a heavy tail
    return np.concatenate([head, tail, [0.0, -1e-300, -700.0]])


@pytest.mark.parametrize("key", ["kl", "hellinger", "js", "alpha=3", "(u-1)**4"])
def test_backends_agree_on_llm_like_tokens(key):
    div = _divergence(key)
    log_p = _llm_like_log_probs(4000)
    reference = band_log(log_p, div, 0.05, backend="numpy")
    backends = ["torch", "numba"] if key in NUMBA_DEFAULT else ["torch"]
    for backend in backends:
        for ref, got in zip(reference, band_log(log_p, div, 0.05, backend=backend), strict=True):
            finite = np.isfinite(ref)
            assert np.array_equal(finite, np.isfinite(got)) and np.array_equal(ref[~finite], got[~finite])
            error = np.abs(got[finite] - ref[finite]) / np.maximum(1, np.abs(ref[finite]))
            assert error.max() <= 2 * TOLERANCE, (backend, error.max())


@pytest.mark.parametrize("backend", ["numpy", "numba", "torch"])
def test_iteration_budget_suffices(backend):
    """Every backend runs the one iteration loop: no token of the contract's hardest corners exhausts it."""
    log_p = -np.logspace(-300, np.log10(700), 120)
    for key in ["reverse_kl", "neyman", "hellinger", "js", "alpha=-2", "u*log(u) - log(u)"]:
        for delta in [1e-8, 1e-3, 1.0, 10.0]:
            _, _, status = band_log(log_p, _divergence(key), delta, backend=backend, return_status=True)
            assert not np.any(np.asarray(status) == -2), (key, delta)


# ------------------------------------------------------------------------------------------------------------
# Properties (hypothesis), per backend
# ------------------------------------------------------------------------------------------------------------

PROPERTY_KEYS = ["kl", "tv", "hellinger", "js", "alpha=-2", "(u-1)**2 + (sqrt(u)-1)**2"]
log_probs = st.floats(min_value=-700.0, max_value=-1e-300, allow_nan=False)
deltas = st.floats(min_value=1e-8, max_value=10.0, allow_nan=False)


def at_most(a, b) -> bool:
    """a <= b up to a relative 1e-12 of rounding (infinite values compared exactly)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    finite = np.isfinite(a) & np.isfinite(b)
    a_f, b_f = np.where(finite, a, 0.0), np.where(finite, b, 0.0)
    return bool(np.all((a <= b) | (finite & (a_f - b_f <= 1e-12 * np.maximum(1.0, np.abs(b_f))))))


def _backend_ids():
    return ["numpy", "torch", "numba"]


@pytest.mark.parametrize("backend", _backend_ids())
@pytest.mark.parametrize("key", PROPERTY_KEYS)
@settings(max_examples=25, deadline=None)
@given(a=log_probs, b=log_probs, delta=deltas, scale=st.floats(min_value=1.0, max_value=100.0))
def test_band_properties(key, backend, a, b, delta, scale):
    if backend == "numba" and key not in NUMBA_DEFAULT:
        backend = "numpy"
    div = _divergence(key)
    lo_p, hi_p = min(a, b), max(a, b)
    lower, upper = band_log(np.array([lo_p, hi_p]), div, delta, backend=backend)
    # lower <= 1 <= upper, and inside the simplex: r <= 1/p
    assert np.all(lower <= 0) and np.all(upper >= 0)
    assert upper[0] <= -lo_p and upper[1] <= -hi_p
    # upper non-increasing and lower non-decreasing in p (a relative 1e-12 wobble is rounding)
    assert at_most(upper[1], upper[0]) and at_most(lower[0], lower[1])
    # nested in delta
    wide_lower, wide_upper = band_log(np.array([lo_p, hi_p]), div, min(delta * scale, 10.0), backend=backend)
    assert at_most(upper, wide_upper) and at_most(wide_lower, lower)


@pytest.mark.parametrize("backend", _backend_ids())
@pytest.mark.parametrize("key", PROPERTY_KEYS)
@settings(max_examples=25, deadline=None)
@given(p=st.floats(min_value=1e-6, max_value=1 - 1e-6), delta=deltas)
def test_mirror_symmetry(key, backend, p, delta):
    """q_lo(p) = 1 - q_up(1 - p)."""
    if backend == "numba" and key not in NUMBA_DEFAULT:
        backend = "numpy"
    div = _divergence(key)
    log_p = math.log(p)
    log_mirror = math.log1p(-p)
    lower, _ = band_log(np.array([log_p]), div, delta, backend=backend)
    _, upper_mirror = band_log(np.array([log_mirror]), div, delta, backend=backend)
    q_lo = math.exp(log_p + lower[0])
    q_up_mirror = math.exp(log_mirror + upper_mirror[0])
    assert abs(q_lo - (1 - q_up_mirror)) <= 1e-12


@pytest.mark.parametrize("key", ["kl", "hellinger", "u*log(u) - log(u)"])
@settings(max_examples=30, deadline=None)
@given(log_p=st.floats(min_value=-40.0, max_value=-1e-6), delta=deltas)
def test_bounds_solve_the_band_equation(key, log_p, delta):
    """g_f(p, r) = delta at each unsaturated bound (evaluated at 50 digits from the float result)."""
    from bandcore.oracle import g_mp

    div = _divergence(key)
    lower, upper = band_log(np.array([log_p]), div, delta, backend="numpy")
    with mp.workdps(50):
        for bound, saturated in ((upper[0], upper[0] == -log_p), (lower[0], lower[0] == -np.inf)):
            if saturated or bound == 0:
                continue
            g = g_mp(div, log_p, bound)
            # dg/dlog r at the root times the admissible error in log r bounds the residual
            step = mp.mpf(1e-12) * max(1, abs(bound))
            slope = abs(g_mp(div, log_p, bound + step) - g) / step
            assert abs(g - delta) <= 4 * slope * step + mp.mpf(1e-15) * delta


# ------------------------------------------------------------------------------------------------------------
# The generic solver also on the divergences that have specialised kernels (kl: Halley; tv, pearson: closed)
# ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded"])
@pytest.mark.parametrize("key", ["kl", "tv", "pearson"])
def test_generic_solver_on_specialised_divergences(key, seeded):
    torch = pytest.importorskip("torch")
    plan = solver_plan(_divergence(key), generic=True)
    for delta in DELTAS:
        ref_lower, ref_upper = oracle(key, LOG_P, delta)
        at_one = backends.lower_at_one(plan, delta)
        seed = backends.seed(plan, delta) if seeded else NO_SEED
        with np.errstate(all="ignore"):
            numpy_result = backends.solver_module(plan, "numpy").generic_bounds(
                LOG_P, delta, at_one, seed.numpy_arrays()
            )
        torch_result = backends.solver_module(plan, "torch").generic_bounds(
            torch.from_numpy(LOG_P), delta, at_one, seed.torch_arrays("cpu")
        )
        for lower, upper, _ in (numpy_result, (t.numpy() for t in torch_result)):
            assert relative_errors(lower, ref_lower).max() <= TOLERANCE
            assert relative_errors(upper, ref_upper).max() <= TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("seeded", [False, True], ids=["unseeded", "seeded"])
@pytest.mark.parametrize("key", ["kl", "tv", "pearson"])
def test_generic_numba_solver_on_specialised_divergences(key, seeded):
    """The generic Newton from its own start (no seed table) and from a seed table, against the oracle (by the
    serial driver, which a call on these few tokens runs: the parallel one would add a compile of its own)."""
    plan = solver_plan(_divergence(key), generic=True)
    module = compiled.numba_module(plan)
    for delta in DELTAS:
        ref_lower, ref_upper = oracle(key, LOG_P, delta)
        lower, upper = np.empty_like(LOG_P), np.empty_like(LOG_P)
        status = np.empty(LOG_P.shape, dtype=np.int8)
        seed = backends.seed(plan, delta) if seeded else NO_SEED
        at_one = backends.lower_at_one(plan, delta)
        module.band_kernel_log_serial(LOG_P, delta, at_one, lower, upper, status, seed.arrays())
        assert relative_errors(lower, ref_lower).max() <= TOLERANCE
        assert relative_errors(upper, ref_upper).max() <= TOLERANCE


@pytest.mark.parametrize("n", [10, 100_000])
def test_kl_numba_and_numpy_agree(n):
    """The one KL solver source, bound to Numba (parallel) and NumPy, on LLM-like tokens."""
    log_p = _llm_like_log_probs(n, seed=3)
    fast = band_log(log_p, "kl", 0.05, backend="numba")
    reference = band_log(log_p, "kl", 0.05, backend="numpy")
    for a, b in zip(fast, reference, strict=True):
        finite = np.isfinite(b)
        assert np.array_equal(a[~finite], b[~finite])
        assert (np.abs(a[finite] - b[finite]) / np.maximum(1, np.abs(b[finite]))).max() <= 2 * TOLERANCE


@pytest.mark.parametrize("backend", ["numpy", "numba", "torch"])
def test_overflowing_far_evaluation_is_not_taken_for_convergence(backend):
    """α = 3 near log p = -355.7: G overflows (slope inf) at the first iterate, which must not stop Newton."""
    torch = pytest.importorskip("torch")
    div = get_divergence("alpha", alpha=3.0)
    log_p = np.array([-355.6561451209393, -355.7, -355.5])
    expected = np.array([float(band_log_mp(div, x, 0.05)[1]) for x in log_p])
    x = torch.tensor(log_p) if backend == "torch" else log_p
    _, upper = band_log(x, div, 0.05, backend=backend)
    np.testing.assert_allclose(np.asarray(upper), expected, rtol=1e-12)


def test_torch_chunks_give_the_unchunked_result(monkeypatch):
    torch = pytest.importorskip("torch")
    x = -torch.logspace(-12, 2.8, 1000, dtype=torch.float64).reshape(10, 100)
    whole = band_log(x, "hellinger", 0.05, backend="torch")
    monkeypatch.setitem(backends.TORCH_CHUNK, "cpu", 64)
    chunked = band_log(x, "hellinger", 0.05, backend="torch")
    for a, b in zip(whole, chunked, strict=True):
        assert a.shape == b.shape == (10, 100)
        assert torch.equal(a, b)


def test_torch_cpu_chunk_is_a_grain_per_thread():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            assert backends.torch_chunk("cpu") == n * backends.TORCH_CPU_CHUNK_PER_THREAD == n * 32_768
        assert backends.torch_chunk("cuda") == backends.TORCH_CHUNK_ACCELERATOR
    finally:
        torch.set_num_threads(threads)


def test_fast_ops_polynomials_are_the_chebyshev_fits_they_name():
    """EXPM1_Q and ATANH_P are mpmath.chebyfit's fits of (e^r - 1 - r - r^2/2)/r^3 on |r| <= ln2/2 and of
    (atanh(s)/s - 1)/s^2 on s^2 <= ((sqrt 2 - 1)/(sqrt 2 + 1))^2, rounded to float64, and their truncation errors
    are what the module says (e^r - 1 within 3.4e-19, log's series within 5e-18)."""
    from bandcore.kernels.numba_fast_ops import ATANH_P, EXPM1_Q

    with mp.workdps(60):
        h = mp.log(2) / 2 * (1 + mp.mpf("1e-9"))

        def q(r):
            return mp.mpf(1) / 6 + r / 24 if abs(r) < mp.mpf("1e-15") else (mp.exp(r) - 1 - r - r * r / 2) / r**3

        z_max = ((mp.sqrt(2) - 1) / (mp.sqrt(2) + 1)) ** 2 * (1 + mp.mpf("1e-9"))

        def p(z):
            return mp.mpf(1) / 3 if z < mp.mpf("1e-30") else (mp.atanh(mp.sqrt(z)) / mp.sqrt(z) - 1) / z

        fit_q, err_q = mp.chebyfit(q, [-h, h], len(EXPM1_Q), error=True)
        fit_p, err_p = mp.chebyfit(p, [0, z_max], len(ATANH_P), error=True)
        assert tuple(float(c) for c in fit_q) == EXPM1_Q and tuple(float(c) for c in fit_p) == ATANH_P
        assert err_q * h**3 < 3.4e-19 and err_p * z_max < 5e-18


def test_numba_fast_ops_match_libm():
    """The written-out exp/expm1/log/log1p/logaddexp of the Numba backend: <= 2 ulp of libm (NumPy) on a sweep
    across the float range and at the special points, and libm's very values there where those are not normal
    numbers (0, -0, inf, NaN, subnormals; log1p(-1) = -inf, not NaN)."""
    from numba import njit

    from bandcore.kernels import numba_fast_ops as fast

    ops = {"exp": (fast.exp, np.exp), "expm1": (fast.expm1, np.expm1), "log": (fast.log, np.log),
           "log1p": (fast.log1p, np.log1p)}  # fmt: skip
    rng = np.random.default_rng(0)
    sweep = np.concatenate([rng.uniform(-745, 709, 4000), rng.uniform(-1, 1, 4000), 10 ** rng.uniform(-320, 300, 4000)])
    special = np.array([0.0, -0.0, -1.0, 1.0, math.inf, -math.inf, math.nan, 5e-324, 2.2250738585072014e-308, -745.2])
    for name, (fast_op, libm) in ops.items():
        kernel = njit(lambda x, op=fast_op: np.array([op(v) for v in x]))
        x = np.concatenate([sweep, -sweep[sweep < 1]]) if name in ("log1p",) else sweep
        with np.errstate(all="ignore"):
            x = np.concatenate([x, special])
            want, got = libm(x), kernel(x)
            ok = np.isfinite(want) & (want != 0)
            ulps = np.abs(got[ok] - want[ok]) / np.spacing(np.abs(want[ok]))
            assert ulps.max() <= 2, (name, x[ok][np.argmax(ulps)])
            normal = np.isfinite(want) & (np.abs(want) >= 2.2250738585072014e-308)
            np.testing.assert_array_equal(got[~normal], want[~normal], err_msg=name)
    logaddexp = njit(lambda a, b: np.array([fast.logaddexp(a[i], b[i]) for i in range(a.size)]))
    a, b = rng.uniform(-800, 800, 2000), rng.uniform(-800, 800, 2000)
    np.testing.assert_allclose(logaddexp(a, b), np.logaddexp(a, b), rtol=4e-16)
    np.testing.assert_array_equal(logaddexp(np.array([-math.inf, math.inf]), np.array([-math.inf, 1.0])),
                                  [-math.inf, math.inf])  # fmt: skip


def test_log1p_phi_has_no_cancellation():
    """log1p_phi(x, 1 + x) = (log1p(x), x - log1p(x)) on NumPy, torch and Numba (the KL seeded pass's cells):
    log1p within 2 ulp and phi within 16 ulp of the 40-digit values over x in (-1, 1e6), also where phi is x^2/2
    next to x = 0 (x - log1p(x) there would have no correct digit); u = den, x = den - 1 gives log(den)."""
    torch = pytest.importorskip("torch")
    from numba import njit

    from bandcore.kernels import numba_fast_ops
    from bandcore.kernels.ops import numpy_ops, torch_ops

    rng = np.random.default_rng(4)
    x = np.concatenate([rng.uniform(-1, 1, 400), 10 ** rng.uniform(-12, 6, 400), -(10 ** rng.uniform(-12, -0.01, 400)),
                        [1e-300, -1e-300, 0.09, 0.11, 0.41, -0.29, -0.3]])  # fmt: skip
    numba_pair = njit(lambda v: [numba_fast_ops.log1p_phi(e, 1.0 + e) for e in v])
    results = {"numpy": numpy_ops.log1p_phi(x, 1.0 + x),
               "torch": [t.numpy() for t in torch_ops().log1p_phi(torch.from_numpy(x), 1.0 + torch.from_numpy(x))],
               "numba": np.array(numba_pair(x)).T}  # fmt: skip
    with mp.workdps(40):
        want = [(mp.log1p(mp.mpf(v)), mp.mpf(v) - mp.log1p(mp.mpf(v))) for v in x.tolist()]
    for name, (lg, phi) in results.items():
        for v, a, b, (wa, wb) in zip(x.tolist(), lg.tolist(), phi.tolist(), want, strict=True):
            assert abs(mp.mpf(a) - wa) <= 2 * 2.0**-52 * abs(wa), (name, v, a)
            assert abs(mp.mpf(b) - wb) <= 16 * 2.0**-52 * abs(wb) + 1e-320, (name, v, b)
    den = np.array([1e-30, 0.3, 0.75, 2.0])
    assert np.allclose(numpy_ops.log1p_phi(den - 1.0, den)[0], np.log(den), rtol=2e-16, atol=0)


def test_expm1_phi_has_no_cancellation():
    """expm1_phi(x) = (expm1(x), expm1(x) - x) on NumPy, torch and Numba (KL's seeded pass in log s): expm1 within
    2 ulp and expm1(x) - x within 16 ulp of the 40-digit values over x in (-1e13, 700), also where it is x^2/2 next to
    x = 0 and across the switch at |x| = 0.35; -inf gives (-1, inf), NaN stays NaN."""
    torch = pytest.importorskip("torch")
    from numba import njit

    from bandcore.kernels import numba_fast_ops
    from bandcore.kernels.ops import numpy_ops, torch_ops

    rng = np.random.default_rng(5)
    x = np.concatenate([rng.uniform(-1, 1, 400), 10 ** rng.uniform(-12, 2.8, 300), -(10 ** rng.uniform(-12, 13, 400)),
                        [1e-300, -1e-300, 0.3465, 0.3467, -0.3465, -0.3467, 0.35, -0.35, 0.349, -0.351]])  # fmt: skip
    numba_pair = njit(lambda v: [numba_fast_ops.expm1_phi(e) for e in v])
    results = {"numpy": numpy_ops.expm1_phi(x),
               "torch": [t.numpy() for t in torch_ops().expm1_phi(torch.from_numpy(x))],
               "numba": np.array(numba_pair(x)).T}  # fmt: skip
    with mp.workdps(40):
        want = [(mp.expm1(mp.mpf(v)), mp.expm1(mp.mpf(v)) - mp.mpf(v)) for v in x.tolist()]
    for name, (em, phi) in results.items():
        for v, a, b, (wa, wb) in zip(x.tolist(), em.tolist(), phi.tolist(), want, strict=True):
            assert abs(mp.mpf(a) - wa) <= 2 * 2.0**-52 * abs(wa), (name, v, a)
            assert abs(mp.mpf(b) - wb) <= 16 * 2.0**-52 * abs(wb) + 1e-320, (name, v, b)
    for pair in (numpy_ops.expm1_phi(np.array([-np.inf, np.nan])), np.array(numba_pair(np.array([-np.inf, np.nan]))).T):
        np.testing.assert_array_equal(pair[0], [-1.0, np.nan])
        np.testing.assert_array_equal(pair[1], [np.inf, np.nan])


def test_exp_ratio_is_exp_over_c_without_spurious_overflow():
    """exp_ratio(x, c) = e^x / c on every namespace (Numba's from exp's own reduction and polynomial): within
    3 ulp of the 40-digit value, finite where e^x overflows and the quotient does not (c > 1, x in (709.78,
    709.78 + log c)), inf beyond, 0 far below, NaN kept."""
    torch = pytest.importorskip("torch")
    from numba import njit

    from bandcore.kernels import numba_fast_ops, numba_ops
    from bandcore.kernels.ops import numpy_ops, torch_ops

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-700, 700, 300), rng.uniform(-1, 1, 100), [709.5, 710.5, 711.6, 712.0]])
    scalar = {name: njit(lambda v, c, op=module.exp_ratio: np.array([op(e, c) for e in v]))
              for name, module in (("numba fast", numba_fast_ops), ("numba", numba_ops))}  # fmt: skip
    for c in (1e-8, 0.05, 1.0, 3.0, 10.0):
        with mp.workdps(40):
            want = [mp.exp(mp.mpf(v)) / mp.mpf(c) for v in x.tolist()]
        with np.errstate(all="ignore"):  # as every NumPy solver call runs
            results = {"numpy": numpy_ops.exp_ratio(x, c),
                       "torch": torch_ops().exp_ratio(torch.from_numpy(x), c).numpy(),
                       **{name: fn(x, c) for name, fn in scalar.items()}}  # fmt: skip
        for name, got in results.items():
            for value, exact, v in zip(got.tolist(), want, x.tolist(), strict=True):
                if exact > mp.mpf("1.7976931348623157e308"):
                    assert value == math.inf, (name, c, v)
                else:
                    assert abs(mp.mpf(value) - exact) <= 3 * 2.0**-52 * exact, (name, c, v, value)
    for fn in scalar.values():
        np.testing.assert_array_equal(fn(np.array([-800.0, math.nan, math.inf]), 3.0), [0.0, math.nan, math.inf])


@pytest.mark.parametrize("name", ["js", "alpha(3)", "hellinger"])
def test_refined_pass_finishes_most_left_tokens_and_agrees_with_the_safeguarded_solver(name):
    """The tokens the seeded pass leaves lie next to a saturation threshold (the seed errs by ~1e-7 there): the
    refined pass (one Newton step on the seed, then the seeded pass) must finish most of them, agree with the
    safeguarded solver where it does, and mark the rest NOT_CONVERGED, never a silent value."""
    div = get_divergence(name)
    plan = solver_plan(div)
    module = backends.solver_module(plan, "numpy")
    delta = 0.05
    lp = -2.0 * np.random.default_rng(5).exponential(size=40_000)  # many tokens around both thresholds
    seed = backends.seed(plan, delta).numpy_arrays()
    at_one = backends.lower_at_one(plan, delta)
    with np.errstate(all="ignore"):
        _, _, status, d_up, d_lo = module.generic_polished_bounds(lp, delta, at_one, *module.seed_pair(lp, seed))
        redo = status == module.NOT_CONVERGED
        left = lp[redo]
        lower, upper, status = module.generic_refined_bounds(left, delta, at_one, d_up[redo], d_lo[redo])[:3]
        full_lower, full_upper, full_status = module.generic_bounds(left, delta, at_one, seed)
    finished = status != module.NOT_CONVERGED
    assert left.size >= 100 and finished.mean() >= 0.8, f"{name}: {left.size} left, {finished.mean():.3f} finished"
    np.testing.assert_array_equal(status[finished], full_status[finished])
    for mine, full in ((lower, full_lower), (upper, full_upper)):
        both = finished & np.isfinite(full)
        np.testing.assert_array_equal(np.isfinite(mine[finished]), np.isfinite(full[finished]))
        scale = np.maximum(1.0, np.abs(full[both]))
        assert np.max(np.abs(mine[both] - full[both]) / scale) <= 1e-13

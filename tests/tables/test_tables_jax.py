"""BandTable.to_jax / BandTable2D.to_jax: the NumPy reader's numbers in JAX, on every shipped table.

float64 (``jax_enable_x64``): equal to the NumPy reader to 1e-12 in the certificate's measure, at random points,
the grid ends, the saturation thresholds and the floats next to them, the tails, p -> 1 (subnormal log p
included), p -> 0, NaN and log p > 0.  float32: within the certificate plus a few float32 roundings (the
rounding of a float32 result alone is 2^-24 = 6e-8, the size of the certificates).
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import pytest

from bandcore import BandTable
from bandcore.tables.shipped import SHIPPED
from bandcore.tables.tabulated import rel_log_error

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

ONE_D = [(n, d) for n, d, _ in SHIPPED if not isinstance(d, tuple)]
TWO_D = [n for n, d, _ in SHIPPED if isinstance(d, tuple)]
#: the sweeps not in the default run (CI runs them with the slow tests): float32 at δ other than 0.05, 2-D tables
#: other than hellinger's (a saturating divergence, both bounds split)
ONE_D_F32 = [pytest.param(n, d, marks=() if d == 0.05 else pytest.mark.slow) for n, d in ONE_D]
TWO_D_SWEEP = [pytest.param(n, marks=() if n == "hellinger" else pytest.mark.slow) for n in TWO_D]
DELTAS_2D = (0.01, 0.0173, 0.05, 0.125, 0.2)
#: float32: |Δ log r| / max(1, |log r|) <= certificate + these (a few float32 roundings of the stored function,
#: the series in δ and the transform), where r is a float32 ratio (|log r| <= 87)
F32_SLACK_1D, F32_SLACK_2D = 2.0**-21, 2.0**-19
F32_RATIO_RANGE = 87.0


@contextmanager
def x64(on: bool):
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", on)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", before)


def _around(values, dtype, steps: int = 3) -> list:
    out = []
    for v in values:
        v = np.asarray(v, dtype=dtype)[()]
        out.append(v)
        for direction in (np.inf, -np.inf):
            w = v
            for _ in range(steps):
                w = np.nextafter(w, dtype.type(direction))
                out.append(w)
    return out


def points(one_d: BandTable, dtype, seed: int = 0) -> np.ndarray:
    """log p: random over L in [1e-300, 800] (float32: [1e-45, 100]), the grid ends and thresholds of both bounds
    with their neighbouring floats, the tails, p -> 1, p -> 0."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    low, high = (1e-300, 800.0) if dtype == np.float64 else (1e-45, 100.0)
    L = [np.exp(rng.uniform(np.log(low), np.log(high), 2000)),
         [0.0, 5e-324, 1e-320, 1e-310, 2.0**-1022, 1e-300, 1e-45, 1e-40, 2.0**-126, 2.0**-125, 2.0**-121,
          2.0**-120, 1e-30, 1e-7, 0.5, 100.0, 700.0, 1e3, 2e3, 1e30, np.inf]]  # fmt: skip
    for kb in (one_d.lower.kernel, one_d.upper.kernel):
        fm = kb.fmeta
        special = [fm[0], fm[1], *((fm[14], fm[14] + fm[9], fm[14] * 0.75, fm[14] * 1.5) if len(fm) > 14 else ())]
        L.append(_around(special, dtype))
        L.append(kb.cells[::7, 0])  # cell starts (in L, or λ for a near part)
    with np.errstate(over="ignore"):
        return -np.concatenate([np.asarray(x, dtype=np.float64) for x in L]).astype(dtype)


def compare(log_jax, log_numpy, dtype, cert: float, slack: float) -> float:
    """The worst error in the certificate's measure (float32: where r is a float32 ratio; beyond, |log r| is
    huge and only its relative error, |log(-log r)| float32 roundings, is asked)."""
    exact = np.asarray(log_numpy, dtype=np.float64)
    got = np.asarray(log_jax, dtype=np.float64)
    err = rel_log_error(got, exact)
    if dtype == np.float64:
        return float(err.max())
    inside = np.abs(exact) <= F32_RATIO_RANGE
    beyond = ~inside & np.isfinite(exact) & (np.abs(exact) < np.finfo(np.float32).max)
    assert np.all(err[beyond] <= cert + 2.0**-22 * np.log(np.abs(exact[beyond]))), "float32, |log r| > 87"
    return float(err[inside].max())


def same_length(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Each array padded with copies of its first point to the longest one's length: the jitted reader is then
    traced and compiled once for all of them (each new length costs a compile of ~2 s)."""
    n = max(a.size for a in arrays)
    return [np.concatenate([a, np.full(n - a.size, a[0], dtype=a.dtype)]) for a in arrays]


@pytest.mark.parametrize(("name", "delta"), ONE_D)
def test_1d_matches_numpy_in_float64(name, delta):
    table = BandTable.shipped(name, delta)
    with x64(True):
        f = jax.jit(table.to_jax(log=True))
        lp = np.concatenate([points(table, np.float64), [1e-7, -0.0, 0.0, 2e-6, np.nan, np.inf]])
        lo, up = (np.asarray(v) for v in f(jnp.asarray(lp)))
    ok = lp <= 1e-6
    ref_lo, ref_up = table.log(lp[ok], backend="numpy")
    assert compare(lo[ok], ref_lo, np.float64, 0, 0) <= 1e-12
    assert compare(up[ok], ref_up, np.float64, 0, 0) <= 1e-12
    assert np.isnan(lo[~ok]).all() and np.isnan(up[~ok]).all()


@pytest.mark.parametrize(("name", "delta"), ONE_D_F32)
def test_1d_float32(name, delta):
    table = BandTable.shipped(name, delta)
    lp = points(table, np.float32)
    with x64(False):
        lo, up = (np.asarray(v) for v in jax.jit(table.to_jax(log=True))(jnp.asarray(lp)))
    assert lo.dtype == np.float32
    ref_lo, ref_up = table.log(lp.astype(np.float64), backend="numpy")
    tol = table.max_rel_error + F32_SLACK_1D
    assert compare(lo, ref_lo, np.float32, table.max_rel_error, F32_SLACK_1D) <= tol
    assert compare(up, ref_up, np.float32, table.max_rel_error, F32_SLACK_1D) <= tol


@pytest.mark.parametrize("name", TWO_D_SWEEP)
def test_2d_matches_numpy_in_float64(name):
    table = BandTable.shipped(name, (0.01, 0.2))
    with x64(True):
        f = jax.jit(table.to_jax(log=True))
        one_ds = [table.at(delta) for delta in DELTAS_2D]
        lps = same_length([np.concatenate([points(one_d, np.float64), [1e-7, 2e-6, np.nan]]) for one_d in one_ds])
        for delta, one_d, lp in zip(DELTAS_2D, one_ds, lps, strict=True):
            lo, up = (np.asarray(v) for v in f(jnp.asarray(lp), delta))
            ok = lp <= 1e-6
            ref_lo, ref_up = one_d.log(lp[ok], backend="numpy")
            assert compare(lo[ok], ref_lo, np.float64, 0, 0) <= 1e-12, delta
            assert compare(up[ok], ref_up, np.float64, 0, 0) <= 1e-12, delta
            assert np.isnan(lo[~ok]).all() and np.isnan(up[~ok]).all()


@pytest.mark.parametrize("name", TWO_D_SWEEP)
def test_2d_float32(name):
    table = BandTable.shipped(name, (0.01, 0.2))
    with x64(False):
        f = jax.jit(table.to_jax(log=True))
        d32s = [np.float32(delta) for delta in (0.0100001, 0.05, 0.125, 0.1999999)]  # float32 deltas inside the range
        one_ds = [table.at(float(d32)) for d32 in d32s]
        lps = same_length([points(one_d, np.float32) for one_d in one_ds])
        for d32, one_d, lp in zip(d32s, one_ds, lps, strict=True):
            lo, up = (np.asarray(v) for v in f(jnp.asarray(lp), d32))
            ref_lo, ref_up = one_d.log(lp.astype(np.float64), backend="numpy")
            tol = table.max_rel_error + F32_SLACK_2D
            assert compare(lo, ref_lo, np.float32, table.max_rel_error, F32_SLACK_2D) <= tol, d32
            assert compare(up, ref_up, np.float32, table.max_rel_error, F32_SLACK_2D) <= tol, d32


def test_2d_threshold_series_gives_the_exact_threshold():
    """The saturated float next to L*(δ) and the remainder, as the 50-digit bisection gives them."""
    from bandcore.tables.jax_grid2d import _threshold, side_arrays, side_series
    from bandcore.tables.split2d import exact_threshold

    table = BandTable.shipped("js", (0.01, 0.2))
    with x64(True):
        for index, side in enumerate(("lower", "upper")):
            arrays = side_arrays((table.lower, table.upper)[index])
            series = side_series(table, index, arrays).threshold
            deltas = np.array([0.01, 0.0123, 0.05, 0.2, 0.125, 0.19999])
            b, lo = (np.asarray(v) for v in _threshold(jnp.asarray(deltas), series, np.dtype(np.float64),
                                                       arrays.kind))  # fmt: skip
            for d, b_jax, lo_jax in zip(deltas, b, lo, strict=True):
                _, b_ref, lo_ref = exact_threshold(table.divergence, float(d), side)
                assert b_jax == b_ref
                assert abs(lo_jax - lo_ref) <= 1e-30 * b_ref


def test_ratios_dtypes_and_transforms():
    table = BandTable.shipped("js", 0.05)
    lp64 = np.log(np.array([1e-30, 0.001, 0.08, 0.5, 0.99, 1.0]))
    with x64(True):
        f, g = table.to_jax(), table.to_jax(log=True)
        lo, up = (np.asarray(v) for v in f(jnp.asarray(lp64)))
        log_lo, log_up = (np.asarray(v) for v in g(jnp.asarray(lp64)))
        np.testing.assert_allclose(lo, np.exp(log_lo), rtol=4e-16)
        np.testing.assert_allclose(up, np.exp(log_up), rtol=4e-16)
        assert f(jnp.asarray(lp64, dtype=jnp.float32))[0].dtype == jnp.float32  # rounded once from float64
        np.testing.assert_array_equal(np.asarray(f(jnp.asarray(lp64, dtype=jnp.float32))[1]),
                                      table(lp64.astype(np.float32))[1])  # fmt: skip
        assert f(jnp.asarray(lp64, dtype=jnp.float16))[0].dtype == jnp.float32
        batch = jnp.asarray(np.stack([lp64, lp64[::-1]]))
        vmapped = jax.vmap(jax.jit(f))(batch)
        np.testing.assert_array_equal(np.asarray(vmapped[1]), np.asarray(f(batch)[1]))
        grad = jax.grad(lambda x: f(x)[1].sum())(jnp.asarray(lp64))
        assert np.all(np.asarray(grad) == 0)  # the bounds carry no gradient
    with pytest.raises(TypeError, match="log must be True or False"):
        table.to_jax(log="yes")
    with pytest.raises(TypeError, match="floating-point"):
        table.to_jax()(jnp.asarray([1, 2]))


@pytest.mark.slow  # 15 s: fits the 2-D table's threshold series (the other 2-D JAX tests take δ as a constant)
def test_2d_delta_is_traced_scalar_or_array():
    table = BandTable.shipped("tv", (0.01, 0.2))
    lp = np.log(np.array([[0.001, 0.01, 0.3], [0.5, 0.9, 0.999]]))
    deltas = np.array([[0.02], [0.15]])
    with x64(True):
        f = table.to_jax()
        per_row = np.asarray(jax.jit(f)(jnp.asarray(lp), jnp.asarray(deltas))[1])
        for i, d in enumerate(deltas[:, 0]):
            np.testing.assert_allclose(per_row[i], table(lp[i], float(d))[1], rtol=1e-14)
        mapped = jax.vmap(f, in_axes=(None, 0))(jnp.asarray(lp[0]), jnp.asarray(deltas[:, 0]))
        np.testing.assert_allclose(np.asarray(mapped[0]), [table(lp[0], float(d))[0] for d in deltas[:, 0]],
                                   rtol=1e-14)  # fmt: skip
        outside = np.asarray(f(jnp.asarray(lp), 0.3)[0])
        assert np.isnan(outside).all()  # outside the table's delta range


def test_import_bandcore_and_a_lookup_load_no_jax():
    code = ("import sys, numpy as np, bandcore as bc; bc.BandTable.shipped('kl', 0.05)(np.array([-1.0]));"
            "assert 'jax' not in sys.modules, 'jax imported'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True)


def test_jax_namespace_exp_ratio():
    """kernels.ops.jax_ops (the namespace the lookup source is bound to): exp_ratio = e^x / c within 3 ulp, finite
    where e^x overflows and the quotient does not."""
    import mpmath as mp

    from bandcore.kernels.ops import jax_ops

    x = np.array([-700.0, -10.0, 0.0, 1.0, 700.0, 709.0, 709.5, 710.0, 710.5])  # e^710.5 overflows, e^710.5/3 not
    with x64(True):
        got = np.asarray(jax.jit(lambda v: jax_ops().exp_ratio(v, 3.0))(jnp.asarray(x)))
    with mp.workdps(40):
        ref = np.array([float(mp.exp(mp.mpf(v)) / 3) for v in x])
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=3 * 2.0**-52)

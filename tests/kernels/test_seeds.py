"""Seed tables (bandcore.kernels.seeds) and the one table-lookup source (bandcore.kernels.lookup).

The seed only changes where the solvers start: seeded and unseeded solutions agree with the oracle, the seed
is within its stated error of the root, the generic Newton needs at most a few steps from it, a user
generator's seed is cached on disk and a damaged cache file is rebuilt, never trusted.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from tiers import crossed

import bandcore as bc
from bandcore.derive import solver_plan
from bandcore.kernels import backends, seeds
from bandcore.kernels.lookup import interpolate
from bandcore.oracle import band_log_mp
from benchmarks.bench import llm_like_log_probs

USER = ["(u-1)**4 + (u-1)**2", "u*log(u) - u + 1 + (sqrt(u) - 1)**2"]
FRACTIONAL = ["alpha(0.7)", "u**(5/2) - 5*u/2 + 3/2"]


def _plan(div, kind=None):
    """The plan of ``div``'s solver; ``kind="generic"``: of the generic solver."""
    return solver_plan(div, generic=kind == "generic")


def _exact_offset(module, L: np.ndarray, delta: float) -> np.ndarray:
    lp = -L
    lq = np.log(-np.expm1(lp))
    with np.errstate(all="ignore"):
        log_r, log_s, saturated, done = module.upper_root(lp, lq, delta, lp * np.nan)
    return np.where(done & ~saturated, log_r - log_s, np.nan)


@pytest.mark.parametrize("name, kind, bound", [("kl", "generic", 1e-9), ("neyman", "generic", 1e-8),
                                               ("hellinger", "generic", None)])  # fmt: skip
def test_seed_is_close_to_the_root(name, kind, bound):
    """Away from saturation thresholds the generic seed's offset is within ~1e-9 of the root's; next to a
    threshold it may be rough, but never a value where the root saturates (KL's own two columns:
    test_documented_figures.py::test_kl_seed_error)."""
    div = bc.resolve(name)
    L = np.exp(np.random.default_rng(0).uniform(np.log(2.0**-40), np.log(704.0), 4000))
    for delta in (1e-4, 0.05, 0.5):
        module = backends.solver_module(_plan(div, kind), "numpy")
        with np.errstate(all="ignore"):
            d_seed = np.logaddexp(0.0, -interpolate(L, *backends.seed(_plan(div, kind), delta).numpy_arrays()))
        d = _exact_offset(module, L, delta)
        assert not np.any(np.isfinite(d_seed) & np.isnan(d)), "a seed where the root saturates"
        error = np.abs(d_seed - d) / d
        assert np.isfinite(error).mean() > 0.15
        assert np.nanmedian(error) < 1e-10
        if bound is not None:
            assert np.nanmax(error) <= bound


@pytest.mark.parametrize("name", ["hellinger", "js", "alpha(3)", *USER])
def test_seeded_generic_newton_stops_within_few_steps(name):
    """From the seed, >= 90 % of LLM-like tokens converge after one evaluation per root, >= 99 % after two and
    >= 99.9 % after eight (the rest lie next to a saturation threshold, where the seed is rough); from the
    small-δ start almost none within two."""
    div = bc.resolve(name)
    module = backends.solver_module(_plan(div, "generic"), "numpy")
    log_p = llm_like_log_probs(4000, seed=1).astype(np.float64)
    log_q = np.log(-np.expm1(log_p))
    seed = backends.seed(_plan(div, "generic"), 0.05).numpy_arrays()
    try:
        done_within = {}
        for steps in (1, 2, 8, 96):
            module.MAX_ITERATIONS = steps
            with np.errstate(all="ignore"):
                up = module.upper_root(log_p, log_q, 0.05, module.seed_offset(-log_p, seed))[3]
                lo = module.upper_root(log_q, log_p, 0.05, module.seed_offset(-log_q, seed))[3]
            done_within[steps] = (up & lo).mean()
    finally:
        module.MAX_ITERATIONS = 96
    assert done_within[1] >= 0.9
    assert done_within[2] >= 0.99
    assert done_within[8] >= 0.999
    assert done_within[96] == 1.0
    module.MAX_ITERATIONS = 2
    try:
        with np.errstate(all="ignore"):
            unseeded = (module.upper_root(log_p, log_q, 0.05, log_p * np.nan)[3]
                        & module.upper_root(log_q, log_p, 0.05, log_p * np.nan)[3])  # fmt: skip
    finally:
        module.MAX_ITERATIONS = 96
    assert unseeded.mean() < 0.05


LOG_P = np.concatenate([-np.logspace(-9, np.log10(700), 30), [-1e-13, -800.0]])


@cache
def _oracle(name: str, delta: float) -> tuple[np.ndarray, np.ndarray]:
    values = [band_log_mp(name, float(x), delta) for x in LOG_P]
    return tuple(np.array([float(v[k]) for v in values]) for k in (0, 1))


@pytest.mark.parametrize(("name", "backend"), crossed([*USER, *FRACTIONAL], ["numpy", "numba", "torch"],
                                                      fast_numba=["alpha(0.7)"]))  # fmt: skip
def test_seeded_solver_meets_the_contract_on_user_generators(name, backend):
    """Two generators outside the catalogue, and two with fractional powers (computed as exp(a log u)), seeded
    on every backend, against the 50-digit oracle."""
    if backend == "torch":
        pytest.importorskip("torch")
    for delta in (1e-3, 0.05, 1.0):
        lower, upper = bc.band_log(LOG_P, name, delta, backend=backend)
        ref_lower, ref_upper = _oracle(name, delta)
        for got, ref in ((lower, ref_lower), (upper, ref_upper)):
            both_inf = np.isinf(got) & (got == ref)
            with np.errstate(invalid="ignore"):
                error = np.abs(got - ref) / np.maximum(1.0, np.abs(ref))
            assert np.all(both_inf | (error <= 1e-12)), (delta, np.nanmax(np.where(both_inf, 0, error)))


def test_user_seed_is_cached_on_disk_and_a_damaged_file_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("BANDCORE_CACHE", str(tmp_path))
    div = bc.resolve(USER[0])
    plan = _plan(div, "generic")
    module = backends.solver_module(plan, "numpy")
    delta = 0.0371
    fresh = seeds.seed_table(module, plan, delta)
    files = list((tmp_path / "seeds").glob("*.npz"))
    assert len(files) == 1
    again = seeds.seed_table(module, plan, delta)  # read from the file
    np.testing.assert_array_equal(again.cells, fresh.cells)
    files[0].write_bytes(b"not an npz file")
    rebuilt = seeds.seed_table(module, plan, delta)
    np.testing.assert_array_equal(rebuilt.cells, fresh.cells)
    np.savez(files[0], values=np.zeros(3), slopes=np.zeros(3))  # a relabelled file of the wrong shape
    np.testing.assert_array_equal(seeds.seed_table(module, plan, delta).cells,
                                  fresh.cells)  # fmt: skip


@pytest.mark.parametrize("name", ["kl", "hellinger", "js", "reverse_kl"])
def test_table_lookup_is_one_source_on_every_backend(name):
    """The certified table read by the NumPy, Numba and torch bindings of bandcore.kernels.lookup (js and
    reverse_kl: bounds split at their thresholds, kinds 4 and 5, and reverse_kl's logarithmic tails)."""
    torch = pytest.importorskip("torch")
    table = bc.BandTable.build(name, 0.05) if name == "hellinger" else bc.BandTable.shipped(name, 0.05)
    near = []
    for bound in (table.lower, table.upper):
        if hasattr(bound, "threshold"):  # next to a split bound's threshold, on both sides
            L_star = bound.threshold
            near += [L_star * (1 + s * 10.0**-k) for k in range(3, 16) for s in (-1, 1)]
            near += [np.nextafter(L_star, 0.0), np.nextafter(L_star, np.inf), L_star]
    log_p = np.concatenate([-np.logspace(-12, 3, 300), [0.0, 5e-7, -np.inf, np.nan, -1e-300, -5e-324, -1e-310],
                            -np.array(near)])  # fmt: skip
    results = {b: table.log(log_p, backend=b) for b in ("numpy", "numba")}
    results["torch"] = tuple(t.numpy() for t in table.log(torch.from_numpy(log_p), backend="torch"))
    for b in ("numba", "torch"):
        for got, ref in zip(results[b], results["numpy"], strict=True):
            # Numba contracts the Horner steps into FMAs: an ulp in F = log(-log r), times F ~ 120 after the exp
            np.testing.assert_allclose(got, ref, rtol=1e-13, atol=0)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))


@pytest.mark.parametrize("name", ["kl", "hellinger", "js", "reverse_kl", "alpha(0.5)", "lecam", *USER])
def test_polished_pass_finishes_most_tokens_and_agrees_with_the_safeguarded_solver(name):
    """The branch-free seeded pass (one Halley/Newton step per root) is the fast path: on LLM-like tokens it must
    finish almost every token itself (else the speed comes from nowhere), and what it finishes must agree with
    the safeguarded solver to the last bits; the rest is marked NOT_CONVERGED, never a silent value."""
    div = bc.resolve(name)
    kind = solver_plan(div).kind
    module = backends.solver_module(solver_plan(div), "numpy")
    delta = 0.05
    lp = llm_like_log_probs(20_000, 1).astype(np.float64)
    lp = np.concatenate([lp, [0.0, -np.inf, np.nan, -750.0, -1e-14]])
    seed = backends.seed(solver_plan(div), delta).numpy_arrays()
    at_one = backends.lower_at_one(solver_plan(div), delta)
    with np.errstate(all="ignore"):
        polished = getattr(module, module.POLISHED[kind])
        lower, upper, status = polished(lp, delta, at_one, *getattr(module, module.SEED_READS[kind])(lp, seed))[:3]
        full_lower, full_upper, full_status = getattr(module, module.ENTRY_POINTS[kind])(lp, delta, at_one, seed)
    finished = status != module.NOT_CONVERGED
    assert finished[:20_000].mean() >= 0.97, f"{name}: the seeded pass finished only {finished[:20_000].mean():.3f}"
    assert not finished[-2]  # below e^-700: no seed, left to the safeguarded solver
    np.testing.assert_array_equal(status[finished], full_status[finished])
    for mine, full in ((lower, full_lower), (upper, full_upper)):
        scale = np.maximum(1.0, np.abs(np.where(np.isfinite(full), full, 1.0)))
        both = finished & np.isfinite(full)
        assert np.all(np.isfinite(mine[both]))
        assert np.max(np.abs(mine[both] - full[both]) / scale[both]) <= 1e-13
        np.testing.assert_array_equal(np.isnan(mine[finished]), np.isnan(full[finished]))
        np.testing.assert_array_equal(np.isneginf(mine[finished]), np.isneginf(full[finished]))


@pytest.mark.parametrize("name", ["kl", "hellinger"])
def test_torch_fallback_runs_once_per_call_and_matches_numpy(name):
    """band_log on a CPU tensor (chunks run the seeded pass, the safeguarded solver runs once on what they left)
    equals the NumPy path: status bit for bit, values within the contract, or next to a threshold within what one
    ulp of log p moves the NumPy bound (torch's, Numba's and NumPy's exp/log differ by an ulp, which the
    ill-conditioned bounds there amplify: Hellinger's lower bound at log p = -3.0083 moves by 2.5e-10 per ulp),
    across several chunks."""
    torch = pytest.importorskip("torch")
    lp = llm_like_log_probs(150_000, 2).astype(np.float64)
    lp[::997] = -750.0  # some tokens every chunk must leave to the safeguarded solver
    lo_t, up_t, st_t = bc.band_log(torch.from_numpy(lp), name, 0.05, backend="torch", return_status=True)
    lo_n, up_n, st_n = bc.band_log(lp, name, 0.05, backend="numpy", return_status=True)
    np.testing.assert_array_equal(st_t.numpy(), st_n)
    below = bc.band_log(np.nextafter(lp, -np.inf), name, 0.05, backend="numpy")
    above = bc.band_log(np.nextafter(lp, 0.0), name, 0.05, backend="numpy")
    for got, want, ends in ((lo_t.numpy(), lo_n, (below[0], above[0])), (up_t.numpy(), up_n, (below[1], above[1]))):
        finite = np.isfinite(want)
        np.testing.assert_array_equal(got[~finite], want[~finite])
        with np.errstate(invalid="ignore"):  # inf - inf where a neighbour saturates
            ulp_move = np.nan_to_num(np.abs(ends[1] - ends[0]) / 2, nan=0.0, posinf=0.0)
        allowed = np.maximum(1e-12 * np.maximum(1.0, np.abs(want)), ulp_move)
        excess = np.abs(got[finite] - want[finite]) / allowed[finite]
        assert excess.max() <= 1.0, excess.max()


@pytest.mark.parametrize("name", ["kl", "js"])
def test_seed_cell_from_bits_is_the_grid_cell(name):
    """The seed read finds L's cell from its bits alone (``seed_index``): the cell the grid's own lookup finds with
    its octave's gathers, for every L in the table's range and next to its cells' edges (outside the range the
    table's ends replace the cell's cubic)."""
    from bandcore.kernels.grid import KernelBound
    from bandcore.kernels.lookup import cell_of
    from bandcore.kernels.slots import OCTAVE_A
    from bandcore.kernels.solvers.common import seed_index

    plan = _plan(bc.resolve(name))
    table: KernelBound = backends.seed(plan, 0.05)
    fm, im, off, shift, cells = table.numpy_arrays()
    a, b = seeds.SEED_RANGE
    knots = seeds.seed_knots()[0]
    L = np.concatenate([np.exp(np.random.default_rng(1).uniform(np.log(a), np.log(b), 20_000)), knots,
                        np.nextafter(knots[1:], 0.0), np.nextafter(knots[:-1], np.inf)])  # fmt: skip
    want = cell_of(L, im[OCTAVE_A], 0, off, shift, cells.shape[0])
    np.testing.assert_array_equal(seed_index(L, (fm, im, off, shift, cells), cells.shape[0]), want)

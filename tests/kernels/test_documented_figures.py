"""The figures docs/math.md and docs/architecture.md give for the kernels, computed here and compared with the
documented value (each doc names the test beside its figure)."""

from __future__ import annotations

import numpy as np
import pytest

import bandcore as bc
from bandcore import _contract
from bandcore.derive import solver_plan
from bandcore.derive.codegen import kernel_functions
from bandcore.derive.generator_facts import branches
from bandcore.kernels import backends, drivers, lookup_drivers, seeds
from bandcore.kernels.seeds import NO_SEED
from bandcore.kernels.solvers import common, generic, kl
from bandcore.oracle import band_log_mp
from benchmarks.inputs import llm_like_log_probs

#: (where the doc states it, the code's value, the documented value)
DOCUMENTED = [
    ("math §1: mpmath limits at 120 digits", lambda: branches.DPS, 120),
    ("math §7: KL runs a fixed 4 steps", lambda: kl.KL_STEPS, 4),
    ("math §7/§8: seed table on L in [2^-40, 704]", lambda: seeds.SEED_RANGE, (2.0**-40, 704.0)),
    ("math §8: 128 cells per octave", lambda: 2**seeds.SEED_LEVEL, 128),
    ("math §8: far tail below log p = -700", lambda: common.LOG_P_TINY, -700.0),
    ("math §8: Taylor branch on |u - 1| < 0.1", lambda: kernel_functions.TAYLOR_RADIUS, 0.1),
    ("math §8: step below 1e-10 relative", lambda: generic.STEP_TOLERANCE, 1e-10),
    ("math §8: budget of 96 iterations", lambda: generic.MAX_ITERATIONS, 96),
    ("math §8: G(d) = delta to 1e-6 relative", lambda: generic.ROOT_TOLERANCE, 1e-6),
    ("math §6b/§9: largest radius 1000", lambda: _contract.DELTA_MAX, 1000.0),
    ("math §9: log p in (0, 1e-6] read as 0", lambda: _contract.LOG_P_TOLERANCE, 1e-6),
    ("math §9: status codes", lambda: tuple(int(s) for s in (bc.Status.CONVERGED, bc.Status.SATURATED,
                                                               bc.Status.NOT_CONVERGED, bc.Status.INVALID_INPUT)),
     (0, 1, -2, -3)),
    ("architecture: blocks of 256 (seeded)", lambda: drivers.BLOCK, 256),
    ("architecture: blocks of 1024 (closed forms)", lambda: drivers.CLOSED_BLOCK, 1024),
    ("architecture: blocks of 1024 (table lookup)", lambda: lookup_drivers.TABLE_BLOCK, 1024),
    ("architecture: serially up to 4,096 tokens", lambda: drivers.SERIAL_MAX, 4096),
]


@pytest.mark.parametrize("where, value, documented", DOCUMENTED, ids=[d[0] for d in DOCUMENTED])
def test_documented_constant(where, value, documented):
    assert value() == documented, where


@pytest.mark.parametrize("name, columns, kilobytes", [("js", 1, 304), ("kl", 2, 507)])
def test_seed_table_size(name, columns, kilobytes):
    """math §8: 6,320 cells, 304 KB of arrays (the octaves of [2^-40, 704], 128 cells each); KL's two columns
    (seeds: both roots in the cell of L = -log p) 507 KB."""
    table = backends.seed(solver_plan(bc.resolve(name)), 0.05)
    assert table.cells.shape == (6320, 2 + 4 * columns)
    assert round(sum(array.nbytes for array in table.arrays()) / 1000) == kilobytes


@pytest.mark.parametrize("delta, bound", [(1e-8, 5e-8), (1e-4, 3e-9), (0.05, 4e-10), (2.0, 2.5e-10)])
def test_kl_seed_error(delta, bound):
    """math §7: KL's seeds (log s at the upper root, log r_lo at the lower) err relatively by less than 5e-8 at
    δ = 1e-8, 3e-9 at 1e-4 and 4e-10 from δ = 0.05 on, over 20,000 log-uniform L in [2^-40, 704] (against KL's own
    4-step solver, itself within 1e-14), with no NaN inside the table."""
    plan = solver_plan(bc.resolve("kl"))
    module = backends.solver_module(plan, "numpy")
    L = np.exp(np.random.default_rng(0).uniform(np.log(2.0**-40), np.log(704.0), 20_000))
    log_p = -L
    log_q = np.log(-np.expm1(log_p))
    with np.errstate(all="ignore"):
        seeded = module.kl_seed_pair(log_p, backends.seed(plan, delta).numpy_arrays())
        exact = np.array([module.kl_upper_root(log_p, log_q, delta)[1], module.kl_upper_root(log_q, log_p, delta)[1]])
    error = np.abs(np.array(seeded) - exact) / np.abs(exact)
    assert not np.isnan(error).any()
    assert bound / 4 < error.max() < bound, (delta, error.max())  # the figure is the table's, not a loose bar


def test_kl_seeded_pass_agrees_with_the_four_steps():
    """math §7: KL's seeded pass (one Newton step in log s from the seeds) agrees with the unseeded 4-step solver to
    2e-15 (contract measure) at 50,000 log-uniform |log p| in [1e-13, 703] and δ from 1e-8 to 10, both bounds, and
    finishes every token whose seeds lie in the table and whose p is at least e^-700 (the rest: the 4 steps)."""
    plan = solver_plan(bc.resolve("kl"))
    module = backends.solver_module(plan, "numpy")
    log_p = -np.exp(np.random.default_rng(1).uniform(np.log(1e-13), np.log(703.0), 50_000))
    worst = 0.0
    for delta in (1e-8, 1e-4, 0.05, 2.0, 10.0):
        seed = backends.seed(plan, delta).numpy_arrays()
        at_one = backends.lower_at_one(plan, delta)
        with np.errstate(all="ignore"):
            seeded = module.kl_polished_bounds(log_p, delta, at_one, *module.kl_seed_pair(log_p, seed))
            full = module.kl_bounds(log_p, delta, at_one, NO_SEED.numpy_arrays())
        finished = seeded[2] != module.NOT_CONVERGED
        np.testing.assert_array_equal(finished, (-log_p >= 2.0**-40) & (log_p >= common.LOG_P_TINY))
        for got, ref in zip(seeded[:2], full[:2], strict=True):
            both = finished & np.isfinite(ref)
            np.testing.assert_array_equal(np.isneginf(got[finished]), np.isneginf(ref[finished]))
            worst = max(worst, float(np.max(np.abs(got[both] - ref[both]) / np.maximum(1.0, np.abs(ref[both])))))
    assert 2e-16 < worst <= 2e-15, worst


def test_kl_four_steps_reach_the_oracle():
    """math §7: KL's unseeded 4 Halley/Newton steps are within 1e-14 (contract measure) of the 50-digit oracle at
    60 random points of log p in [-1e4, 0) (log-uniform in |log p| from 1e-14) and δ in [1e-8, 10]."""
    div = bc.resolve("kl")
    module = backends.solver_module(solver_plan(div), "numpy")
    rng = np.random.default_rng(3)
    log_p = -np.exp(rng.uniform(np.log(1e-14), np.log(1e4), 60))
    deltas = np.exp(rng.uniform(np.log(1e-8), np.log(10.0), 60))
    for x, delta in zip(log_p, deltas, strict=True):
        with np.errstate(all="ignore"):
            lower, upper, _ = module.kl_bounds(np.array([x]), float(delta), -float(delta), NO_SEED.numpy_arrays())
        for got, ref in zip((lower[0], upper[0]), map(float, band_log_mp(div, x, delta)), strict=True):
            assert got == ref or abs(got - ref) <= 1e-14 * max(1.0, abs(ref)), (x, delta, got, ref)  # == : -inf


def _finished(module, log_p, log_q, delta, seed, steps, seeded=True):
    """Fraction of tokens whose both roots finish within ``steps`` evaluations of G."""
    module.MAX_ITERATIONS = steps
    try:
        with np.errstate(all="ignore"):
            start_up = module.seed_offset(-log_p, seed) if seeded else log_p * np.nan
            start_lo = module.seed_offset(-log_q, seed) if seeded else log_p * np.nan
            up = module.upper_root(log_p, log_q, delta, start_up)[3]
            lo = module.upper_root(log_q, log_p, delta, start_lo)[3]
    finally:
        module.MAX_ITERATIONS = 96
    return (up & lo).mean()


@pytest.mark.parametrize("name, after_one", [("hellinger", 95.3), ("js", 98.2)])
def test_one_evaluation_rates(name, after_one):
    """math §8: on 20,000 LLM-like tokens at δ = 0.05, 95.3 % (Hellinger) and 98.2 % (JS) finish after one
    evaluation of G per root from the seed, at least 99.8 % after two; from the small-δ start fewer than 5 %
    within two."""
    div = bc.resolve(name)
    plan = solver_plan(div, generic=True)
    module = backends.solver_module(plan, "numpy")
    log_p = llm_like_log_probs(20_000, seed=0).astype(np.float64)
    log_q = np.log(-np.expm1(log_p))
    seed = backends.seed(plan, 0.05).numpy_arrays()
    assert round(100 * _finished(module, log_p, log_q, 0.05, seed, 1), 1) == after_one
    assert _finished(module, log_p, log_q, 0.05, seed, 2) >= 0.998
    assert _finished(module, log_p, log_q, 0.05, seed, 2, seeded=False) < 0.05

"""The shared oracle suite (tests/data/oracle_cases.csv): coverage, freshness, and band_log against it."""

import math
import sys
from pathlib import Path

import mpmath as mp
import numpy as np
import pytest
from oracle_cases import ORACLE_CASES_PATH, load_oracle_arrays, load_oracle_cases

import bandcore as bc
from bandcore.band import band_log
from bandcore.derive import derive

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
import make_oracle_cases

CASES = load_oracle_cases()


def test_suite_covers_every_divergence_range_and_saturation():
    names = {case.name for case in CASES}
    assert set(bc.list_divergences()) - {"alpha"} <= names
    assert {"alpha(3)", "alpha(2)", "alpha(0.5)", "alpha(-1)"} <= names
    log_p = [case.log_p for case in CASES]
    assert min(log_p) == -700.0 and max(log_p) == -1e-300
    deltas = {case.delta for case in CASES}
    assert min(deltas) == 1e-8 and max(deltas) == 10.0
    assert any(case.lower_saturated for case in CASES) and any(case.upper_saturated for case in CASES)
    assert any(not (case.lower_saturated or case.upper_saturated) for case in CASES)
    assert len(CASES) == len(make_oracle_cases.DIVERGENCES) * len(make_oracle_cases.LOG_P) * len(
        make_oracle_cases.DELTA
    )


def test_references_carry_at_least_25_digits():
    for case in CASES[:50]:
        for text in (case.log_lower_text, case.log_upper_text):
            if text != "-inf":
                mantissa = text.split("e")[0].replace("-", "").replace(".", "").lstrip("0")
                assert len(mantissa) >= 25 or mp.mpf(text) == int(mp.mpf(text)), text


@pytest.mark.parametrize("index", [0, 97, 211, 388, 545, 779])
def test_file_matches_the_generator(index):
    """Freshness: re-compute rows spread over the file with the generator script."""
    case = CASES[index]
    alpha = dict(case.divergence.params).get("alpha")
    name = "alpha" if alpha is not None else case.name
    expected = make_oracle_cases.row(name, alpha, case.log_p, case.delta)
    with ORACLE_CASES_PATH.open() as handle:
        line = handle.read().splitlines()[index + 1]
    assert line == ",".join(expected[c] for c in make_oracle_cases.COLUMNS)


def test_loader_selects_and_rejects():
    kl = load_oracle_arrays("kl", delta=0.05)
    assert kl["log_p"].shape == (len(make_oracle_cases.LOG_P),)
    assert load_oracle_cases("alpha(0.5)")[0].divergence == bc.get_divergence("alpha", alpha=0.5)
    with pytest.raises(ValueError, match="alpha\\(7\\)"):
        load_oracle_cases("alpha(7)")


def test_saturated_flags_match_the_bounds():
    for case in CASES:
        assert case.lower_saturated == (case.log_lower == -math.inf)
        if case.upper_saturated:
            assert case.log_upper == -case.log_p


def _on_threshold(log_p: np.ndarray, div, delta: float) -> np.ndarray:
    p_star = derive(div).saturation_lower(delta)
    if not 0 < p_star < 1:
        return np.zeros(log_p.shape, dtype=bool)
    return np.abs(np.exp(log_p) - p_star) <= 4 * np.spacing(p_star)


def test_exact_threshold_rows_are_the_only_exclusions():
    excluded = [
        (c.name, c.delta) for c in CASES if _on_threshold(np.array([c.log_p]), c.divergence, c.delta)[0]
    ]
    assert sorted(excluded) == [("alpha(2)", 0.5), ("alpha(3)", 0.5), ("tv", 0.5)]


@pytest.mark.parametrize("name", sorted({case.name for case in CASES}))
def test_band_log_meets_the_contract_on_the_suite(name):
    """fp64 contract: |Δ log r| <= 1e-12 · max(1, |log r|); saturated bounds exact."""
    cases = load_oracle_cases(name)
    div = cases[0].divergence
    for delta in sorted({c.delta for c in cases}):
        sel = [c for c in cases if c.delta == delta]
        log_p = np.array([c.log_p for c in sel])
        lower, upper = band_log(log_p, div, delta)
        ref_lo = np.array([c.log_lower for c in sel])
        ref_up = np.array([c.log_upper for c in sel])
        sat = np.array([c.lower_saturated for c in sel])
        assert np.all(lower[sat] == -np.inf), (name, delta)
        # On a saturation threshold itself the bound's condition number is infinite (log r_lo -> -inf as
        # p -> p*): a double log p that rounds onto p* is excluded from the fp64 contract, nothing else.
        on_threshold = _on_threshold(log_p, div, delta)
        sat |= on_threshold
        tol_lo = 1e-12 * np.maximum(1, np.abs(ref_lo[~sat]))
        np.testing.assert_array_less(np.abs(lower[~sat] - ref_lo[~sat]), tol_lo + 1e-300, err_msg=f"{name} δ={delta}")
        np.testing.assert_array_less(np.abs(upper - ref_up), 1e-12 * np.maximum(1, np.abs(ref_up)) + 1e-300)

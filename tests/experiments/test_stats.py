"""The comparison's statistics (experiments.toy.stats) against hand-computed values and SciPy's own tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from experiments.toy.stats import format_diff, format_mean, mean_ci, paired_difference, t_quantile


def test_t_quantile_matches_the_printed_table():
    # two-sided 95 %: t_{0.975, dof} from any Student-t table
    assert t_quantile(0.95, 1) == pytest.approx(12.7062047, rel=1e-7)
    assert t_quantile(0.95, 4) == pytest.approx(2.7764451, rel=1e-7)
    assert t_quantile(0.95, 9) == pytest.approx(2.2621572, rel=1e-7)
    assert t_quantile(0.90, 9) == pytest.approx(1.8331129, rel=1e-7)
    with pytest.raises(ValueError, match="level"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="dof"):
        t_quantile(0.95, 0)


def test_mean_ci_by_hand():
    entry = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, s = sqrt(10/4), SE = s/sqrt(5) = sqrt(0.5), half-width = 2.7764451 * sqrt(0.5) = 1.9632432
    assert entry["n"] == 5 and entry["mean"] == 3.0
    assert entry["std"] == pytest.approx(math.sqrt(2.5))
    assert entry["se"] == pytest.approx(math.sqrt(0.5))
    assert entry["ci_half_width"] == pytest.approx(1.9632432, rel=1e-7)
    assert entry["ci"] == pytest.approx([3.0 - 1.9632432, 3.0 + 1.9632432], rel=1e-7)
    assert entry["per_seed"] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert format_mean(entry) == "3.000 ± 1.963"


def test_mean_ci_agrees_with_scipy_interval():
    x = np.random.default_rng(3).normal(0.4, 0.2, size=10)
    entry = mean_ci(x)
    low, high = stats.t.interval(0.95, df=9, loc=x.mean(), scale=stats.sem(x))
    assert entry["ci"] == pytest.approx([low, high], rel=1e-12)
    assert entry["se"] == pytest.approx(stats.sem(x), rel=1e-12)


def test_one_value_has_no_interval():
    entry = mean_ci([0.25])
    assert entry == {"n": 1, "mean": 0.25, "std": 0.0, "se": None, "ci": None, "ci_half_width": None,
                     "per_seed": [0.25]}
    assert format_mean(entry) == "0.250"
    diff = paired_difference([0.5], [0.25])
    assert diff["t"] is None and diff["p"] is None and diff["ahead"] == 1
    assert format_diff(diff) == "+0.250 (1/1 higher)"


def test_paired_difference_is_scipy_ttest_rel():
    rng = np.random.default_rng(11)
    y = rng.uniform(0.0, 1.0, size=10)
    x = y + rng.normal(0.05, 0.1, size=10)
    entry = paired_difference(x, y)
    reference = stats.ttest_rel(x, y)
    assert entry["t"] == pytest.approx(reference.statistic, rel=1e-12)
    assert entry["p"] == pytest.approx(reference.pvalue, rel=1e-10)
    interval = reference.confidence_interval(0.95)
    assert entry["ci"] == pytest.approx([interval.low, interval.high], rel=1e-12)
    assert entry["per_seed"] == pytest.approx(list(x - y))
    assert entry["ahead"] + entry["behind"] == 10 and entry["ahead"] == int((x > y).sum())


def test_paired_difference_by_hand():
    # d = (0.1, 0.3, -0.1): mean 0.1, s = 0.2, SE = 0.2/sqrt(3), t = sqrt(3)/2, half-width =
    # t_{0.975,2} * SE = 4.3026527 * 0.2/sqrt(3) = 0.4968275; with 2 dof the t CDF is 1/2 + t/(2 sqrt(2 + t^2)),
    # so the two-sided p = 1 - t/sqrt(2 + t^2) = 1 - (sqrt(3)/2)/sqrt(11/4) = 1 - sqrt(3/11)
    entry = paired_difference([0.6, 0.8, 0.4], [0.5, 0.5, 0.5])
    assert entry["mean"] == pytest.approx(0.1) and entry["std"] == pytest.approx(0.2)
    assert entry["t"] == pytest.approx(math.sqrt(3) / 2)
    assert entry["ci_half_width"] == pytest.approx(0.4968275, rel=1e-6)
    assert entry["p"] == pytest.approx(1 - math.sqrt(3 / 11), rel=1e-10)
    assert (entry["ahead"], entry["behind"]) == (2, 1)
    assert format_diff(entry) == "+0.100 [-0.397, +0.597] (2/3 higher)"


def test_equal_differences_give_a_point_interval_and_no_t():
    entry = paired_difference([0.4, 0.6], [0.1, 0.3])
    assert entry["std"] == pytest.approx(0.0, abs=1e-15) and entry["t"] is None and entry["p"] is None
    assert entry["ci"] == pytest.approx([0.3, 0.3])
    assert format_diff(entry) == "+0.300 [+0.300, +0.300] (2/2 higher)"  # no star: no spread, no test
    # a method against itself: zero difference, no seed ahead or behind
    same = paired_difference([0.2, 0.7, 0.5], [0.2, 0.7, 0.5])
    assert same["mean"] == 0.0 and same["ci"] == [0.0, 0.0] and (same["ahead"], same["behind"]) == (0, 0)


def test_the_star_marks_an_interval_that_excludes_zero():
    ahead = paired_difference([1.1, 1.2, 1.3, 1.25], [1.0, 1.0, 1.0, 1.0])
    assert ahead["ci"][0] > 0 and format_diff(ahead).endswith("(4/4 higher) *")
    mixed = paired_difference([1.1, 0.8, 1.3, 0.9], [1.0, 1.0, 1.0, 1.0])
    assert mixed["ci"][0] < 0 < mixed["ci"][1] and not format_diff(mixed).endswith("*")


@pytest.mark.parametrize(
    ("values", "reference", "message"),
    [
        ([1.0, 2.0], [1.0], "same length"),
        ([1.0, float("nan")], [1.0, 2.0], "values: must be finite"),
        ([], [], "non-empty"),
    ],
)
def test_bad_inputs_are_named(values, reference, message):
    with pytest.raises(ValueError, match=message):
        paired_difference(values, reference)

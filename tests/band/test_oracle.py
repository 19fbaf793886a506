"""The mpmath oracle itself, against closed forms derived by hand (independent of bandcore.derive)."""

import math

import mpmath as mp
import pytest

from bandcore.divergences import get_divergence
from bandcore.oracle import band_log_mp, g_mp


def _ratio(bounds):
    return tuple(mp.exp(b) for b in bounds)


@pytest.mark.parametrize("p", ["1e-9", "0.08", "0.5", "0.97"])
@pytest.mark.parametrize("delta", ["1e-6", "0.05", "0.3"])
def test_pearson_matches_square_root_closed_form(p, delta):
    with mp.workdps(50):
        p_, d_ = mp.mpf(p), mp.mpf(delta)
        lo, up = _ratio(band_log_mp("pearson", mp.log(p_), d_))
        width = mp.sqrt(d_ * (1 - p_) / p_)
        expected_up = min(1 + width, 1 / p_)
        expected_lo = max(1 - width, 0)
        assert abs(up / expected_up - 1) < mp.mpf("1e-35")
        assert lo == 0 if expected_lo == 0 else abs(lo / expected_lo - 1) < mp.mpf("1e-35")


def test_kl_at_one_half_matches_closed_form():
    # p = 1/2: q = (1 ± sqrt(1 - exp(-2δ)))/2, so r = 1 ± sqrt(1 - exp(-2δ))
    with mp.workdps(50):
        lo, up = _ratio(band_log_mp("kl", mp.log(mp.mpf("0.5")), mp.mpf("0.05")))
        root = mp.sqrt(1 - mp.exp(-mp.mpf("0.1")))
        assert abs(up - (1 + root)) < mp.mpf("1e-38")
        assert abs(lo - (1 - root)) < mp.mpf("1e-38")


def test_tv_is_linear_and_saturates_at_the_thresholds():
    lo, up = _ratio(band_log_mp("tv", math.log(0.3), 0.05))
    assert abs(up - (1 + mp.mpf(0.05) / mp.mpf(math.exp(math.log(0.3))))) < 1e-30
    lo, up = band_log_mp("tv", math.log(0.04), 0.05)  # p <= δ: lower saturates
    assert lo == mp.ninf
    lo, up = band_log_mp("tv", math.log(0.96), 0.05)  # p >= 1 - δ: upper saturates at 1/p
    assert up == -mp.mpf(math.log(0.96))


def test_reference_values():
    # δ = 0.05, 15 digits (independent high-precision values)
    cases = {
        ("kl", 0.5): (0.691515669824154, 1.30848433017585),
        ("kl", 0.08): (0.261695843479393, 2.41055379375736),
        ("hellinger", 0.08): (0.0490474798726003, 2.9878275201274),
    }
    for (name, p), (lo_ref, up_ref) in cases.items():
        lo, up = _ratio(band_log_mp(name, mp.log(mp.mpf(p)), 0.05))
        assert float(lo) == pytest.approx(lo_ref, rel=1e-13)
        assert float(up) == pytest.approx(up_ref, rel=1e-13)
    lo, up = band_log_mp("js", mp.log(mp.mpf("0.08")), 0.05)
    assert lo == mp.ninf and float(mp.exp(up)) == pytest.approx(4.0946982543017, rel=1e-12)


def test_roots_solve_the_binary_equation_at_extreme_log_p():
    for name in ("kl", "neyman", "hellinger", "js"):
        for log_p in (-700.0, -30.0, -1e-12):
            lo, up = band_log_mp(name, log_p, 0.05)
            with mp.workdps(50):
                for y in (lo, up):
                    if y in (mp.ninf, -mp.mpf(log_p)):
                        continue
                    # g - δ changes sign within a relative 1e-30 of the returned root
                    below = g_mp(get_divergence(name), log_p, y * (1 - mp.mpf("1e-30"))) - mp.mpf(0.05)
                    above = g_mp(get_divergence(name), log_p, y * (1 + mp.mpf("1e-30"))) - mp.mpf(0.05)
                    assert below <= 0 < above


def test_p_equal_one_uses_the_perspective_limit():
    lo, up = band_log_mp("kl", 0.0, 0.05)
    assert up == 0 and abs(lo + mp.mpf(0.05)) < 1e-35  # KL: [e^{-δ}, 1]
    lo, up = band_log_mp("pearson", 0.0, 0.05)
    assert lo == 0 and up == 0  # f̃ grows faster than u: no room at all


def test_kl_lower_bound_far_below_the_double_range():
    lo, _ = band_log_mp("kl", -700.0, 0.05)
    # log r_lo ≈ -1 - δ/p for δ ≫ p
    assert lo / (-1 - mp.mpf(0.05) / mp.exp(-700)) == pytest.approx(1, rel=1e-12)


def _plain_bisection(h, inside, outside, rel_tol):
    """The textbook search the oracle's bracketed root must reproduce: halve until the bracket is narrow."""
    while abs(outside - inside) > rel_tol * max(abs(inside), abs(outside)):
        mid = (inside + outside) / 2
        inside, outside = (mid, outside) if h(mid) <= 0 else (inside, mid)
    return (inside + outside) / 2


@pytest.mark.parametrize("name", ["kl", "neyman", "hellinger", "cosh(u-1) - 1", "max(u - 2, 0)",
                                  "where(abs(u - 1) <= 1/2, (u - 1)**2/2, abs(u - 1)/2 - 1/8)"])  # fmt: skip
def test_bracketed_root_is_plain_bisections_root_in_fewer_evaluations(name, monkeypatch):
    """Illinois steps inside bisection's bracket: the same roots to 1e-36 (relative), on smooth, kinked and
    exponentially growing generators and at log p next to 0 and far below, in at most a third of the
    evaluations of plain bisection (counted, not timed)."""
    import bandcore.oracle as oracle

    counts = {}

    def counted(search, label):
        def run(h, inside, outside, rel_tol):
            def h_counted(y):
                counts[label] = counts.get(label, 0) + 1
                return h(y)

            return search(h_counted, inside, outside, rel_tol)

        return run

    log_ps = [-1e-300, -1e-30, -1e-6, -0.3, -3.0, -40.0, -700.0]
    results = {}
    for label, search in (("bisection", _plain_bisection), ("bracketed", oracle._bracketed_root)):
        monkeypatch.setattr(oracle, "_bracketed_root", counted(search, label))
        results[label] = [band_log_mp(name, x, delta) for x in log_ps for delta in (1e-6, 0.05, 0.9)]
    for want, got in zip(results["bisection"], results["bracketed"], strict=True):
        for w, g in zip(want, got, strict=True):
            assert w == g or abs(g - w) <= mp.mpf("1e-36") * abs(w), (name, w, g)
    assert counts["bracketed"] * 3 <= counts["bisection"], counts

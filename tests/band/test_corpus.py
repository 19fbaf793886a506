r"""A literature corpus of f-divergence generators, each written in the grammar and held to the full contract.

Every entry is a generator from a published list (its source below, author, title, year) or a named variant of
one (marked ``variant``: the construction is stated, nothing is cited for it).  For each:

* it is accepted by the grammar and the generator checks;
* :func:`bandcore.band_log` on every backend (numpy, numba, torch) matches the 50-digit oracle
  (:mod:`bandcore.oracle`) at :data:`POINTS`, to the contract :math:`10^{-12}\max(1, |\log r|)`, saturated ends
  exactly (the points cover both saturated sides and the interior: :func:`test_points_cover_every_side`);
* its 1-D table at δ = 0.05 is built and certified ≤ 1e-7, and agrees with the oracle within its certificate
  at :data:`TABLE_LOG_P`.

Non-convex candidates from the same lists (sign slips, exponents outside a family's range, a distance that
is not squared) are refused by the generator checks, with the reason.

CI cost: one SymPy derivation, one Numba compile (about 8 s, most of it) and one table build per entry dominate
(the oracle points are few; the references are computed once per process and shared by the tests); the backend
and table tests are marked slow (their measured cost: docs/architecture.md, "Two test tiers").
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import mpmath as mp
import numpy as np
import pytest

import bandcore as bc
from bandcore.divergences import Divergence, GeneratorError
from bandcore.oracle import band_log_mp


@dataclass(frozen=True)
class Entry:
    key: str
    formula: str
    source: str


SOURCES = {
    "KL1951": 'Kullback & Leibler, "On information and sufficiency", Ann. Math. Statist. (1951)',
    "Csiszar1967": (
        'Csiszár, "Information-type measures of difference of probability distributions and indirect '
        'observations", Studia Sci. Math. Hungar. (1967)'
    ),
    "AliSilvey1966": (
        'Ali & Silvey, "A general class of coefficients of divergence of one distribution from another", '
        "J. R. Stat. Soc. B (1966)"
    ),
    "LieseVajda2006": (
        'Liese & Vajda, "On divergences and informations in statistics and information theory", '
        "IEEE Trans. Inf. Theory (2006)"
    ),
    "SasonVerdu2016": 'Sason & Verdú, "f-Divergence inequalities", IEEE Trans. Inf. Theory (2016)',
    "Pearson1900": (
        'Pearson, "On the criterion that a given system of deviations from the probable ... can be reasonably '
        'supposed to have arisen from random sampling", Phil. Mag. (1900)'
    ),
    "Neyman1949": 'Neyman, "Contribution to the theory of the χ² test", Proc. Berkeley Symp. (1949)',
    "Hellinger1909": (
        'Hellinger, "Neue Begründung der Theorie quadratischer Formen von unendlichvielen Veränderlichen", '
        "J. reine angew. Math. (1909)"
    ),
    "Bhattacharyya1943": (
        'Bhattacharyya, "On a measure of divergence between two statistical populations defined by their '
        'probability distributions", Bull. Calcutta Math. Soc. (1943)'
    ),
    "Topsoe2000": (
        'Topsøe, "Some inequalities for information divergence and related measures of discrimination", '
        "IEEE Trans. Inf. Theory (2000)"
    ),
    "LeCam1986": 'Le Cam, "Asymptotic Methods in Statistical Decision Theory", Springer (1986)',
    "Lin1991": 'Lin, "Divergence measures based on the Shannon entropy", IEEE Trans. Inf. Theory (1991)',
    "Jeffreys1946": (
        'Jeffreys, "An invariant form for the prior probability in estimation problems", Proc. R. Soc. A (1946)'
    ),
    "CressieRead1984": 'Cressie & Read, "Multinomial goodness-of-fit tests", J. R. Stat. Soc. B (1984)',
    "Vajda1973": (
        'Vajda, "χ^α-divergence and generalized Fisher\'s information", Trans. 6th Prague Conf. on Information '
        "Theory (1973)"
    ),
    "NielsenNock2014": (
        'Nielsen & Nock, "On the chi square and higher-order chi distances for approximating f-divergences", '
        "IEEE Signal Process. Lett. (2014; arXiv 2013)"
    ),
    "BartheOlmedo2013": (
        'Barthe & Olmedo, "Beyond differential privacy: composition theorems and relational logic for '
        'f-divergences between probabilistic programs", ICALP (2013)'
    ),
    "Balle2018": (
        'Balle, Barthe & Gaboardi, "Privacy amplification by subsampling: tight analyses via couplings and '
        'divergences", NeurIPS (2018)'
    ),
    "Marton1996": (
        'Marton, "Bounding d̄-distance by informational divergence: a method to prove measure concentration", '
        "Ann. Probab. (1996)"
    ),
    "DeGroot1962": 'DeGroot, "Uncertainty, information, and sequential experiments", Ann. Math. Statist. (1962)',
    "Huber1964": 'Huber, "Robust estimation of a location parameter", Ann. Math. Statist. (1964)',
    "Taneja1995": (
        'Taneja, "New developments in generalized information measures", Advances in Imaging and Electron '
        "Physics (1995)"
    ),
    "KOV1991": (
        'Kafka, Österreicher & Vincze, "On powers of f-divergences defining a distance", Studia Sci. Math. '
        "Hungar. (1991)"
    ),
    "Tsallis1998": 'Tsallis, "Generalized entropy-based criterion for consistent testing", Phys. Rev. E (1998)',
    "OsterreicherVajda2003": (
        'Österreicher & Vajda, "A new class of metric divergences on probability spaces and its applicability '
        'in statistics", Ann. Inst. Statist. Math. (2003)'
    ),
    "CichockiAmari2010": (
        'Cichocki & Amari, "Families of Alpha- Beta- and Gamma-divergences: flexible and robust measures of '
        'similarities", Entropy (2010)'
    ),
}

#: The corpus.  ``source`` names keys of :data:`SOURCES`; "variant: ..." states a construction instead.
CORPUS = [
    # the classical list (Csiszár 1967; Ali & Silvey 1966; Liese & Vajda 2006, Table I)
    Entry("kl", "-log(u)", "KL1951 LieseVajda2006"),
    Entry("reverse_kl", "u*log(u)", "KL1951 LieseVajda2006"),
    Entry("kl_normalised", "u*log(u) - u + 1", "Csiszar1967 AliSilvey1966"),
    Entry("total_variation", "abs(u - 1)/2", "Csiszar1967 LieseVajda2006"),
    Entry("pearson", "(u - 1)**2", "Pearson1900 LieseVajda2006"),
    Entry("neyman", "(u - 1)**2/u", "Neyman1949 LieseVajda2006"),
    Entry("neyman_slope", "1/u - 1", "variant: Neyman's χ² with the affine part -(u - 1) added (same divergence)"),
    Entry("squared_hellinger", "(sqrt(u) - 1)**2", "Hellinger1909 LieseVajda2006"),
    Entry("bhattacharyya_affinity", "1 - sqrt(u)", "Bhattacharyya1943: 1 - Σ √(π π_old)"),
    Entry("triangular", "(u - 1)**2/(u + 1)", "Topsoe2000 LeCam1986"),
    Entry("jeffreys", "(u - 1)*log(u)", "Jeffreys1946 LieseVajda2006"),
    Entry("symmetric_chi2", "(u - 1)**2*(u + 1)/u", "variant: Pearson1900 + Neyman1949 (their sum)"),
    # Shannon-entropy divergences (Lin 1991): JS, its skew (weighted) forms, the K divergences
    Entry("jensen_shannon", "u*log(u)/2 - (1 + u)/2*log((1 + u)/2)", "Lin1991"),
    Entry("skew_js_quarter", "u*log(u)/4 - (u/4 + 3/4)*log(u/4 + 3/4)", "Lin1991: weights (1/4, 3/4)"),
    Entry("skew_js_tenth", "u*log(u)/10 - (u/10 + 9/10)*log(u/10 + 9/10)", "Lin1991: weights (1/10, 9/10)"),
    Entry("lin_k", "u*log(2*u/(1 + u))", "Lin1991: K(π, π_old) = KL(π ‖ (π + π_old)/2)"),
    Entry("lin_k_reverse", "-log((1 + u)/2)", "Lin1991: K(π_old, π)"),
    Entry("taneja_ag", "(u + 1)/2*log((u + 1)/(2*sqrt(u)))", "Taneja1995: arithmetic-geometric mean divergence"),
    # power families
    Entry("cressie_read_2_3", "(u**(5/3) - 1 - 5/3*(u - 1))/(2/3*5/3)", "CressieRead1984: λ = 2/3"),
    Entry("freeman_tukey", "(u**(1/2) - 1 - (u - 1)/2)/(-1/2*1/2)", "CressieRead1984: λ = -1/2"),
    Entry("cressie_read_m2", "(u**(-1) - 1 + (u - 1))/(-2*(-1))", "CressieRead1984: λ = -2"),
    Entry("cressie_read_3", "(u**4 - 1 - 4*(u - 1))/12", "CressieRead1984: λ = 3"),
    Entry("amari_alpha_m_half", "(u**(-1/2) - 1 + (u - 1)/2)/(3/4)", "CichockiAmari2010: α = -1/2"),
    Entry("hellinger_order_3_2", "(u**(3/2) - 1)/(1/2)", "SasonVerdu2016 LieseVajda2006: order 3/2"),
    Entry("hellinger_order_1_3", "(u**(1/3) - 1)/(-2/3)", "SasonVerdu2016 LieseVajda2006: order 1/3"),
    Entry("tsallis_2", "u**2 - u", "Tsallis1998: q = 2"),
    Entry("tsallis_half", "(sqrt(u) - u)/(-1/2)", "Tsallis1998: q = 1/2"),
    Entry("vajda_chi_3", "abs(u - 1)**3", "Vajda1973: k = 3"),
    Entry("vajda_chi_3_2", "abs(u - 1)**(3/2)", "Vajda1973: k = 3/2"),
    Entry("chi_4", "(u - 1)**4", "Vajda1973 NielsenNock2014: k = 4"),
    Entry("puri_vincze_3", "abs(1 - u)**3/(1 + u)**2", "KOV1991: k = 3"),
    Entry("osterreicher_vajda_2", "sqrt(1 + u**2) - (1 + u)/sqrt(2)", "OsterreicherVajda2003: β = 2, up to a factor"),
    # kinks: hockey-stick, Marton, DeGroot, Huber
    Entry("hockey_stick_2", "max(u - 2, 0)", "BartheOlmedo2013 Balle2018 SasonVerdu2016: E_γ, γ = 2"),
    Entry("hockey_stick_e_half", "max(u - exp(1/2), 0)", "Balle2018: E_γ, γ = e^ε, ε = 1/2"),
    Entry("hockey_stick_conjugate", "max(1 - 2*u, 0)", "BartheOlmedo2013: E_2(π_old ‖ π), the conjugate u f(1/u)"),
    Entry("marton", "max(1 - u, 0)**2", "Marton1996 SasonVerdu2016"),
    Entry("degroot_0_3", "3/10 - min(3/10, 7/10*u)", "DeGroot1962 LieseVajda2006: prior 0.3"),
    Entry(
        "huber_half",
        "where(abs(u - 1) <= 1/2, (u - 1)**2/2, abs(u - 1)/2 - 1/8)",
        "variant: Huber1964's loss at c = 1/2 applied to u - 1 (a smoothed total variation)",
    ),
    Entry("log_cosh", "log(cosh(u - 1))", "variant: log-cosh of u - 1 (a smooth total variation)"),
]

#: Non-convex candidates: (key, formula, what it is).  Each must be refused as not convex.
NON_CONVEX = [
    ("cressie_read_sign_slip", "(u**(5/3) - 1 - 5/3*(u - 1))/(-2/3*5/3)", "CressieRead1984 λ = 2/3, sign slipped"),
    ("minus_log_squared", "-log(u)**2", "-(log u)², a squared KL generator with the sign read wrongly"),
    ("signed_chi_3", "(u - 1)**3", "NielsenNock2014's Pearson-type χ^k at odd k = 3: signed"),
    ("vajda_chi_half", "abs(u - 1)**(1/2)", "Vajda1973's |u - 1|^k outside k >= 1"),
    ("hellinger_distance", "abs(sqrt(u) - 1)", "the Hellinger distance, not squared"),
    ("tsallis_minus_1", "(u**(-1) - u)/(-2)", "Tsallis1998's q outside q > 0"),
    ("jeffreys_sign_slip", "(1 - u)*log(u)", "Jeffreys1946 with the sign slipped"),
    ("u_log_squared", "u*log(u)**2", "u (log u)²: a squared reverse-KL integrand"),
]

#: (log p, δ) of the oracle comparison: p from 1e-11 to 0.99, δ small and large.
LOG_P = np.array([-25.0, -3.0, -0.4, -0.01])
DELTAS = (0.02, 0.4)
TABLE_DELTA = 0.05
TABLE_LOG_P = np.array([-12.0, -1.5, -0.05])
BACKENDS = ("numpy", "numba", "torch")
CONTRACT = 1e-12


def _ids(entries):
    return [e.key for e in entries]


@functools.cache
def _pairs(formula: str, delta: float, log_ps: tuple[float, ...]) -> list[tuple[mp.mpf, mp.mpf]]:
    """The 50-digit (log r_lo, log r_up) at each log p, computed once per process."""
    div = bc.resolve(formula)
    return [band_log_mp(div, x, delta) for x in log_ps]


def _reference(formula: str, delta: float, log_ps: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    pairs = _pairs(formula, delta, log_ps)
    return np.array([float(lo) for lo, _ in pairs]), np.array([float(up) for _, up in pairs])


def _saturated(formula: str, delta: float, log_ps: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Which ends saturate, decided at 50 digits: an upper bound that only rounds to -log p is not saturated
    (e.g. Jeffreys at log p = -0.01, δ = 0.4: log r_up = 0.01 - 4e-20) and is held to the contract's measure."""
    pairs = _pairs(formula, delta, log_ps)
    return (np.array([lo == -math.inf for lo, _ in pairs]),
            np.array([up == -mp.mpf(x) for (_, up), x in zip(pairs, log_ps, strict=True)]))  # fmt: skip


def _errors(got: np.ndarray, want: np.ndarray, saturated: np.ndarray, log_p: np.ndarray, side: str) -> list[str]:
    """Mismatches in the contract's measure; a saturated end must be exact."""
    bad = []
    for g, w, sat, x in zip(np.asarray(got, dtype=float), want, saturated, log_p, strict=True):
        if sat:
            if g != w:
                bad.append(f"{side} at log p={x:g}: {g!r}, saturated {w!r}")
        elif not abs(g - w) <= CONTRACT * max(1.0, abs(w)):
            bad.append(f"{side} at log p={x:g}: {g!r} vs {w!r} (error {abs(g - w) / max(1.0, abs(w)):.2e})")
    return bad


def test_corpus_is_large_distinct_and_cited():
    assert len(CORPUS) >= 30 and len(NON_CONVEX) >= 5
    formulas = [bc.resolve(e.formula).formula for e in CORPUS]
    assert len(set(formulas)) == len(formulas)
    assert len({e.key for e in CORPUS}) == len(CORPUS)
    for entry in CORPUS:
        cited = [word.rstrip(":") for word in entry.source.split() if word.rstrip(":") in SOURCES]
        assert cited or entry.source.startswith("variant: "), entry
    for _, _, what in NON_CONVEX:
        assert what


@pytest.mark.parametrize("entry", CORPUS, ids=_ids(CORPUS))
def test_entry_is_a_generator(entry):
    div = Divergence.from_expression(entry.formula)
    assert bc.resolve(div.formula) == div


@pytest.mark.parametrize(("key", "formula", "what"), NON_CONVEX, ids=[k for k, _, _ in NON_CONVEX])
def test_non_convex_candidate_is_refused_with_the_reason(key, formula, what):
    with pytest.raises(GeneratorError, match="is not convex on"):
        Divergence.from_expression(formula)


def test_points_cover_every_side():
    """Over the corpus, the oracle points hold lower-saturated, upper-saturated and interior bounds."""
    kinds = set()
    for entry in CORPUS:
        for delta in DELTAS:
            sat_lo, sat_up = _saturated(entry.formula, delta, tuple(LOG_P))
            kinds |= {"lower" for s in sat_lo if s}
            kinds |= {"upper" for s in sat_up if s}
            kinds |= {"interior" for a, b in zip(sat_lo, sat_up, strict=True) if not (a or b)}
    assert kinds == {"lower", "upper", "interior"}


@pytest.mark.slow
@pytest.mark.parametrize("entry", CORPUS, ids=_ids(CORPUS))
def test_entry_against_the_oracle_on_every_backend(entry):
    torch = pytest.importorskip("torch")
    bad = []
    for delta in DELTAS:
        want_lo, want_up = _reference(entry.formula, delta, tuple(LOG_P))
        sat_lo, sat_up = _saturated(entry.formula, delta, tuple(LOG_P))
        for backend in BACKENDS:
            x = torch.from_numpy(LOG_P) if backend == "torch" else LOG_P
            try:
                lo, up = bc.band_log(x, entry.formula, delta, backend=backend)
            except Exception as err:  # one line per failing (backend, δ): the report lists them all
                bad.append(f"{backend} δ={delta}: {type(err).__name__}: {err}")
                continue
            for line in _errors(lo, want_lo, sat_lo, LOG_P, "lower") + _errors(up, want_up, sat_up, LOG_P, "upper"):
                bad.append(f"{backend} δ={delta}: {line}")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.parametrize("entry", CORPUS, ids=_ids(CORPUS))
def test_entry_table_is_certified_and_matches_the_oracle(entry):
    table = bc.BandTable.build(entry.formula, TABLE_DELTA)
    assert table.max_rel_error <= 1e-7
    lo, up = table.log(TABLE_LOG_P)
    want_lo, want_up = _reference(entry.formula, TABLE_DELTA, tuple(TABLE_LOG_P))
    for got, want in ((lo, want_lo), (up, want_up)):
        got = np.asarray(got, dtype=float)
        finite = np.isfinite(want)
        assert np.array_equal(got[~finite], want[~finite])
        err = np.abs(got[finite] - want[finite]) / np.maximum(1.0, np.abs(want[finite]))
        assert err.max(initial=0.0) <= table.max_rel_error, (entry.key, err)

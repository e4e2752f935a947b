"""exact_tests against independent computations: scipy (the library the module replaces), exact rational
arithmetic with Python integers and Fractions, 50-digit Decimal sums, and closed forms of the Student-t
law. Also checks that the metrics that use these tests run without importing scipy."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import special, stats

from equipoise.evaluators.metrics import exact_tests as et
from equipoise.evaluators.metrics.determinability import fisher_table_p, spearman
from equipoise.evaluators.metrics.robustness import mcnemar_test


def _same(got: float, want: float, rel: float, tiny: float = 0.0) -> bool:
    """Equal within ``rel``, or both NaN, or both the same infinity, or both below ``tiny``."""
    if math.isnan(want) or math.isnan(got):
        return math.isnan(want) and math.isnan(got)
    if math.isinf(want) or math.isinf(got):
        return got == want
    if abs(want) <= tiny and abs(got) <= tiny:
        return True
    return abs(got - want) <= rel * abs(want)


# ---------------------------------------------------------------------------------------------
# Fisher
# ---------------------------------------------------------------------------------------------
def _fisher_rational(a: int, b: int, c: int, d: int, tol: Fraction = Fraction(0)) -> Fraction:
    """The p-value by definition, in exact arithmetic: the hypergeometric weights C(r1, x) C(r2, c1-x)
    of the tables whose weight is at most the observed one's times (1 + tol), over all weights."""
    r1, r2, c1 = a + b, c + d, a + c
    weights = [math.comb(r1, x) * math.comb(r2, c1 - x) for x in range(max(0, c1 - r2), min(r1, c1) + 1)]
    obs = math.comb(r1, a) * math.comb(r2, c1 - a)
    return Fraction(sum(w for w in weights if w <= obs * (1 + tol)), sum(weights))


def _fisher_decimal(a: int, b: int, c: int, d: int) -> float:
    """The p-value by definition with 50-digit Decimals: the pmf walked from the mode by the ratio
    recurrence until it drops below 1e-420 of the mode (further terms cannot change a double)."""
    r1, r2, c1 = a + b, c + d, a + c
    lo, hi = max(0, c1 - r2), min(r1, c1)
    with localcontext() as ctx:
        ctx.prec = 50
        mode = (r1 + 1) * (c1 + 1) // (r1 + r2 + 2)
        w = {mode: Decimal(1)}
        t, x = Decimal(1), mode
        while x < hi and t > Decimal("1e-420"):
            t = t * (r1 - x) * (c1 - x) / ((x + 1) * (r2 - c1 + x + 1))
            x += 1
            w[x] = t
        t, x = Decimal(1), mode
        while x > lo and t > Decimal("1e-420"):
            t = t * x * (r2 - c1 + x) / ((r1 - x + 1) * (c1 - x + 1))
            x -= 1
            w[x] = t
        obs = w[a]
        # ties: exact ties come out of 50-digit products within far less than 1e-40 of each other
        p = sum(v for v in w.values() if v <= obs * (1 + Decimal("1e-40"))) / sum(w.values())
        return float(min(p, Decimal(1)))


def test_fisher_every_small_table_matches_scipy_and_exact_rationals() -> None:
    for a, b, c, d in itertools.product(range(11), repeat=4):
        odds, p = et.fisher_exact_2x2(a, b, c, d)
        ref = stats.fisher_exact([[a, b], [c, d]])
        assert _same(odds, float(ref.statistic), 1e-15), (a, b, c, d, odds, ref.statistic)
        assert _same(p, float(ref.pvalue), 1e-9), (a, b, c, d, p, ref.pvalue)
        if min(a + b, c + d, a + c, b + d) > 0:
            assert _same(p, float(_fisher_rational(a, b, c, d)), 1e-13), (a, b, c, d)
            assert 0 < p <= 1


def test_fisher_random_large_tables_match_scipy() -> None:
    rng = np.random.default_rng(13)
    for i in range(200):
        if i % 2:  # two rows drawn from nearby proportions: p-values spread over (0, 1]
            n1, n2 = (int(v) for v in rng.integers(1, 10**5, 2))
            p = rng.uniform(0.001, 0.999)
            a, c = int(rng.binomial(n1, p)), int(rng.binomial(n2, min(1.0, p * rng.uniform(0.95, 1.05))))
            table = (a, n1 - a, c, n2 - c)
        else:  # cells of unrelated sizes 0 .. 10^5: mostly tiny p-values, some underflowing to 0
            table = tuple(int(v) for v in rng.integers(0, 10 ** rng.integers(1, 6, 4)))
        odds, p = et.fisher_exact_2x2(*table)
        ref = stats.fisher_exact([list(table[:2]), list(table[2:])])
        assert _same(odds, float(ref.statistic), 1e-15), table
        assert _same(p, float(ref.pvalue), 1e-9, tiny=1e-300), (table, p, ref.pvalue)


@pytest.mark.parametrize(
    "table",
    [
        (1_000_000, 999_000, 1_000_000, 1_000_000),
        (30_000, 25_000, 28_000, 27_000),
        (99_999, 4, 77_777, 123),
        (120, 80, 100, 100),
        (250_000, 250_000, 250_000, 250_000),  # the observed table is the mode: p = 1 exactly
        (5_000, 3_000, 3_000, 5_000),  # rows and columns mirror each other: exact ties across the mode
    ],
)
def test_fisher_large_tables_match_50_digit_sums(table: tuple[int, int, int, int]) -> None:
    # tighter than scipy can be held to: its log-factorial pmf is off by ~1e-10 at these sizes
    assert _same(et.fisher_exact_2x2(*table)[1], _fisher_decimal(*table), 1e-12)


def test_fisher_zero_conventions() -> None:
    # an empty row or column: one possible table, p = 1, the odds ratio undefined
    for table in [(0, 0, 3, 4), (0, 3, 0, 4), (5, 0, 5, 0), (0, 0, 0, 0)]:
        odds, p = et.fisher_exact_2x2(*table)
        assert math.isnan(odds) and p == 1.0
    # b * c == 0 with full margins: infinite odds; a * d == 0: zero odds
    assert et.fisher_exact_2x2(1, 0, 3, 4) == (math.inf, 1.0)  # x = 0 and x = 1 are equally likely
    assert et.fisher_exact_2x2(2, 0, 0, 3) == (math.inf, pytest.approx(0.1, rel=1e-15))  # 2 tables of 10
    assert et.fisher_exact_2x2(0, 2, 3, 0) == (0.0, pytest.approx(0.1, rel=1e-15))
    # far out in the tail the p-value is below the smallest double
    assert et.fisher_exact_2x2(500_000, 0, 0, 500_000) == (math.inf, 0.0)
    with pytest.raises(ValueError, match="non-negative"):
        et.fisher_exact_2x2(1, -1, 2, 2)


def test_fisher_near_tie_is_decided_exactly() -> None:
    # margins rows 58 / 146, columns 60 / 144: P(x = 14) is 8.4e-8 (relative) above P(x = 20), so
    # observing x = 20 must NOT count x = 14 (as scipy, and the definition, say); a 1 + 1e-7 tolerance
    # (R's fisher.test) would count it and give 0.394
    table = (20, 38, 40, 106)
    r1, r2 = 58, 146
    w14, w20 = math.comb(r1, 14) * math.comb(r2, 46), math.comb(r1, 20) * math.comb(r2, 40)
    assert w20 < w14 <= w20 * (1 + Fraction(1, 10**7))
    p = et.fisher_exact_2x2(*table)[1]
    assert p == pytest.approx(float(_fisher_rational(*table, tol=Fraction(0))), rel=1e-13)
    assert p == pytest.approx(0.31361807548372905, rel=1e-13)
    assert p == pytest.approx(float(stats.fisher_exact([[20, 38], [40, 106]]).pvalue), rel=1e-12)
    loose = _fisher_rational(*table, tol=Fraction(1, 10**7))  # R's tolerance
    assert float(loose) == pytest.approx(0.39444497619552227, rel=1e-13)


def test_fisher_exact_ties_across_the_mode_count_on_both_sides() -> None:
    # rows and columns that mirror each other: P(x) == P(c1 - x) exactly, so the mirror table of the
    # observed one must be counted; its floating-point log-probability may differ in the last bits
    for table in [(30, 70, 70, 30), (2_000, 3_000, 3_000, 2_000), (41, 59, 59, 41)]:
        p = et.fisher_exact_2x2(*table)[1]
        assert p == pytest.approx(float(_fisher_rational(*table, tol=Fraction(0))), rel=1e-12), table


def test_binom_cdf_half_takes_numpy_integers() -> None:
    # numpy int64 would wrap in the coefficient products and in 1 << n; the function casts first
    assert et.binom_cdf_half(np.int64(30), np.int64(100)) == et.binom_cdf_half(30, 100)
    assert et.binom_cdf_half(np.int64(30), np.int64(100)) == pytest.approx(
        float(stats.binom.cdf(30, 100, 0.5)), rel=1e-12
    )


def test_fisher_tie_decision_direction_and_symmetries() -> None:
    # margins rows 58 / 146, column 60: P(14) > P(20), so x = 14 is NOT "no more likely" than
    # a = 20, and x = 20 is no more likely than a = 14 (both directions of the exact product)
    assert et._no_more_likely(14, 20, 58, 146, 60) is False
    assert et._no_more_likely(20, 14, 58, 146, 60) is True
    # a tie found by the product, where no margin symmetry applies: checked against exact integers
    r1, r2, c1 = 58, 146, 60
    w = {x: math.comb(r1, x) * math.comb(r2, c1 - x) for x in range(0, 59)}
    for x, a in [(14, 20), (20, 14), (3, 40), (40, 3), (25, 26)]:
        assert et._no_more_likely(x, a, r1, r2, c1) is (w[x] <= w[a]), (x, a)
    # equal row totals: the mirror image c1 - a is an exact tie, found without the product
    assert et._no_more_likely(60, 40, 100, 100, 100) is True
    # equal column totals: r1 - a is an exact tie
    assert et._no_more_likely(7, 23, 30, 70, 50) is True


def test_spearman_large_n_sums_do_not_wrap() -> None:
    # n = 2 * 10^6: sum(rank^2) passes 2^63 (an int64 sum wraps); rho against scipy
    rng = np.random.default_rng(1)
    x = rng.normal(size=2_000_000)
    y = 0.001 * x + rng.normal(size=2_000_000)
    rho, p = et.spearman_rho_p(x, y)
    ref = stats.spearmanr(x, y)
    assert rho == pytest.approx(float(ref.statistic), rel=1e-9)
    assert p == pytest.approx(float(ref.pvalue), rel=1e-6)


def test_fisher_huge_equal_rows_table_does_not_overflow() -> None:
    # rows of 2 * 10^7 each and a p far in the tail: the mirror table is |x - a| = 72,000 steps away
    # (the product once overflowed Decimal's exponent range there); the value against scipy
    a, n = 9_964_000, 20_000_000
    p = fisher_table_p(a, n, 10_036_000, n)[1]
    ref = stats.fisher_exact([[a, n - a], [10_036_000, n - 10_036_000]])
    assert _same(p, float(ref.pvalue), 1e-7)  # scipy's own pmf is off by ~1e-9 at this size
    assert 0 < p < 1e-100


def test_fisher_table_p_keeps_its_contract() -> None:
    assert all(math.isnan(v) for v in fisher_table_p(3, 0, 4, 9))  # an empty row: no test
    assert all(math.isnan(v) for v in fisher_table_p(3, 5, 0, 0))
    # [[correct, wrong], [correct_ref, wrong_ref]] = [[2, 9], [9, 1]]: p = 8 / 4199 by hand
    odds, p = fisher_table_p(2, 11, 9, 10)
    assert odds == pytest.approx(2 * 1 / (9 * 9), rel=1e-15) and p == pytest.approx(8 / 4199, rel=1e-13)


# ---------------------------------------------------------------------------------------------
# McNemar's tails
# ---------------------------------------------------------------------------------------------
def test_binom_cdf_half_exact_for_small_n() -> None:
    for n in range(61):
        for k in range(n + 1):
            got = et.binom_cdf_half(k, n)
            exact = Fraction(sum(math.comb(n, i) for i in range(k + 1)), 2**n)
            assert got == float(exact), (k, n)  # one correctly rounded division
            assert _same(got, float(stats.binom.cdf(k, n, 0.5)), 1e-12), (k, n)
    assert et.binom_cdf_half(-1, 5) == 0.0 and et.binom_cdf_half(7, 5) == 1.0
    with pytest.raises(ValueError):
        et.binom_cdf_half(0, -1)


@pytest.mark.parametrize(
    "n,k",
    [
        (16_384, 8000),
        (16_385, 8000),
        (20_000, 9000),
        (20_000, 7500),
        (20_000, 9_900),
        (20_001, 10_001),
        (30_001, 15_000),
    ],
)
def test_binom_cdf_half_large_n(n: int, k: int) -> None:
    # above n = 2^14 the sum is in floating point, anchored on the central binomial's series
    total, term = 0, 1
    for i in range(k + 1):  # the exact integer sum of C(n, i), i <= k
        total += term
        term = term * (n - i) // (i + 1)
    exact = total / (1 << n)
    got = et.binom_cdf_half(k, n)
    assert _same(got, exact, 1e-13), (got, exact)
    assert _same(got, float(stats.binom.cdf(k, n, 0.5)), 1e-11)


def test_binom_cdf_half_huge_n() -> None:
    for n, k in [(10**6, 499_000), (10**6 + 1, 500_400), (10**9, 5 * 10**8 - 10**5)]:
        assert _same(et.binom_cdf_half(k, n), float(stats.binom.cdf(k, n, 0.5)), 1e-9)
    assert et.binom_cdf_half(400_000, 10**6) == 0.0  # ~exp(-20000): below the smallest double
    assert et.binom_cdf_half(600_000, 10**6) == 1.0


def test_chi2_sf_1df_matches_scipy() -> None:
    for x in np.r_[0.0, np.logspace(-12, math.log10(1400), 400)]:
        got = et.chi2_sf_1df(float(x))
        assert _same(got, float(stats.chi2.sf(x, 1)), 1e-12), x
        assert _same(got, 2 * float(stats.norm.sf(math.sqrt(x))), 1e-12), x  # Q = Z^2
    assert et.chi2_sf_1df(0.0) == 1.0 and et.chi2_sf_1df(-1.0) == 1.0 and math.isnan(et.chi2_sf_1df(math.nan))


def test_mcnemar_test_matches_scipy_tails() -> None:
    for b, c in itertools.product(range(40), repeat=2):
        method, _, p = mcnemar_test(b, c)
        n = b + c
        if method == "exact":
            want = 1.0 if n == 0 else min(1.0, 2 * float(stats.binom.cdf(min(b, c), n, 0.5)))
        else:
            want = float(stats.chi2.sf((abs(b - c) - 1) ** 2 / n, 1))
        assert _same(p, want, 1e-12), (b, c)


# ---------------------------------------------------------------------------------------------
# incomplete beta and Spearman
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("a,b", [(1, 1), (1, 7), (3, 2), (5, 5), (12, 1), (20, 31), (1, 60)])
def test_betainc_integer_parameters_exact(a: int, b: int) -> None:
    # for integers, I_x(a, b) = P(Binomial(a + b - 1, x) >= a): a finite sum, exact at rational x
    m = a + b - 1
    for x in (Fraction(1, 1000), Fraction(1, 7), Fraction(1, 2), Fraction(5, 7), Fraction(999, 1000)):
        exact = sum(math.comb(m, j) * x**j * (1 - x) ** (m - j) for j in range(a, m + 1))
        got = et.betainc(a, b, float(x))
        assert _same(got, float(exact), 2e-14), (a, b, x)


def test_betainc_student_t_closed_forms() -> None:
    # two-sided Student-t tails P(|T| > t) = I_{df/(df+t^2)}(df/2, 1/2): df = 1 (Cauchy) 2/pi atan(1/t);
    # df = 2: 1 - t / s with s = sqrt(2 + t^2), written 2 / (s (s + t)) to avoid the cancellation
    for t in np.logspace(-6, 6, 200):
        s = math.sqrt(2 + t * t)
        assert _same(
            et.betainc(0.5, 0.5, 1 / (1 + t * t), t * t / (1 + t * t)), 2 / math.pi * math.atan(1 / t), 1e-14
        )
        assert _same(et.betainc(1.0, 0.5, 2 / (2 + t * t), t * t / (2 + t * t)), 2 / (s * (s + t)), 1e-14)


def test_betainc_matches_scipy() -> None:
    rng = np.random.default_rng(3)
    for i in range(3000):
        if i % 2:  # the Spearman case: a = df / 2, b = 1/2
            a, b = float(rng.integers(1, 400)) / 2, 0.5
        else:
            a, b = (float(v) for v in rng.uniform(0.05, 200, 2))
        x = float(rng.uniform() ** rng.choice([1, 4, 16]))
        want = float(special.betainc(a, b, x))
        # x^a (1-x)^b alone carries ~1e-16 * (a |log x| + b |log(1-x)|) relative error in any double
        # evaluation; on top, half-integer parameters take an exact log-beta (~1e-16) and the others
        # lgamma's cancellation (~1e-16 * lgamma(a + b))
        conditioning = 4e-16 * (a * abs(math.log(x)) + b * abs(math.log1p(-x)))
        tol = (3e-14 if b == 0.5 else 2e-12) + conditioning
        assert _same(et.betainc(a, b, x), want, tol, tiny=1e-300), (a, b, x)
    assert et.betainc(2.0, 3.0, 0.0) == 0.0 and et.betainc(2.0, 3.0, 1.0) == 1.0
    for bad in [(0.0, 1.0, 0.5), (1.0, -1.0, 0.5), (1.0, 1.0, 1.5), (1.0, 1.0, math.nan)]:
        with pytest.raises(ValueError):
            et.betainc(*bad)


def test_twice_average_ranks_match_scipy_rankdata() -> None:
    rng = np.random.default_rng(5)
    for n in (1, 2, 7, 100):
        v = rng.integers(0, 5, n).astype(float)
        assert (et._twice_average_ranks(v) == 2 * stats.rankdata(v)).all()
    assert (et._twice_average_ranks(np.array([0.0, -0.0, 1.0])) == [3, 3, 6]).all()  # -0.0 ties 0.0


def _check_spearman(x: np.ndarray, y: np.ndarray) -> None:
    rho, p = et.spearman_rho_p(x, y)
    ref = stats.spearmanr(x, y)
    assert _same(rho, float(ref.statistic), 1e-10), (x, y)
    assert _same(p, float(ref.pvalue), 1e-10), (x, y, p, ref.pvalue)
    assert (rho, p) == spearman(x, y)


def test_spearman_matches_scipy_random_and_tied() -> None:
    rng = np.random.default_rng(7)
    for i in range(600):
        n = int(rng.integers(3, 80))
        x = rng.normal(size=n)
        y = rng.uniform(-1, 1) * x + rng.normal(size=n)
        if i % 3 == 1:  # heavy ties in both
            x, y = np.round(x * 2) / 2, rng.integers(0, 4, n).astype(float)
        if np.ptp(x) == 0 or np.ptp(y) == 0:
            continue
        _check_spearman(x, y)
    # accuracies of a few groups: fractions with ties, the shape the trade-off metric passes
    _check_spearman(np.array([0.25, 0.5, 0.75, 0.8, 0.5]), np.array([0.75, 0.5, 0.25, 1.0, 0.5]))


def test_spearman_small_and_degenerate() -> None:
    for x, y in [
        ([1, 2, 3], [1, 3, 2]),
        ([1, 2, 3], [2, 2, 1]),
        ([3, 1, 2], [1, 2, 3]),
        ([1, 2, 3, 4], [1, 2, 4, 3]),
    ]:
        _check_spearman(np.array(x, float), np.array(y, float))
    # n = 3, rho = 1/2: p = I_{3/4}(1/2, 1/2) = 2/pi asin(sqrt(3)/2) = 2/3
    assert et.spearman_rho_p(np.array([1.0, 2, 3]), np.array([1.0, 3, 2])) == (
        0.5,
        pytest.approx(2 / 3, rel=1e-15),
    )
    # a perfect monotone relation: exactly +-1 and p = 0 (scipy rounds rho to 0.9999999999999999 for
    # some inputs and then reports a p of ~1e-24 instead of 0)
    for x, y in [
        ([1, 2, 3, 4, 5], [5, 6, 7, 8, 9]),
        ([1, 2, 3], [3, 2, 1]),
        (list(range(50)), [v**3 for v in range(50)]),
    ]:
        rho, p = et.spearman_rho_p(np.array(x, float), np.array(y, float))
        ref = stats.spearmanr(x, y)
        assert abs(rho) == 1.0 and p == 0.0
        assert rho == pytest.approx(float(ref.statistic), abs=1e-15) and float(ref.pvalue) < 1e-20
    # n = 2: rho = +-1 with no degrees of freedom; a constant input or a NaN: nothing to report
    assert et.spearman_rho_p(np.array([1.0, 2.0]), np.array([2.0, 1.0]))[0] == -1.0
    assert math.isnan(et.spearman_rho_p(np.array([1.0, 2.0]), np.array([2.0, 1.0]))[1])
    for x, y in [([1, 1, 1], [1, 2, 3]), ([1, 2, math.nan], [1, 2, 3]), ([1], [1])]:
        assert all(math.isnan(v) for v in et.spearman_rho_p(np.array(x, float), np.array(y, float)))
    with pytest.raises(ValueError, match="differ in length"):
        et.spearman_rho_p(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0]))


# ---------------------------------------------------------------------------------------------
# the metrics path imports no scipy
# ---------------------------------------------------------------------------------------------
def test_metrics_tests_do_not_import_scipy() -> None:
    # a fresh interpreter: this test process has scipy loaded already (by the imports above)
    code = """
import sys
import numpy as np
from equipoise.evaluators.metrics import determinability, robustness
assert determinability.fisher_table_p(3, 10, 7, 10)[1] > 0
assert determinability.spearman(np.array([1.0, 2, 3, 5]), np.array([2.0, 1, 4, 3]))[0] == 0.6
assert robustness.mcnemar_test(3, 9)[0] == "exact" and robustness.mcnemar_test(30, 9)[0] == "chi2"
loaded = sorted(m for m in sys.modules if m == "scipy" or m.startswith("scipy."))
print(",".join(loaded))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout

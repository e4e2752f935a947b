"""The three small hypothesis tests the metrics report, written out so the metrics pass never imports scipy.

The metrics used scipy.stats only for a handful of scalar tests on tiny aggregated results, and its
import is not small: calling the three metric helpers that need these tests peaked at 186 MiB RSS in
~2.4 s with scipy, 128 MiB in ~0.9 s with this module (stop 27, a fresh interpreter each). Memory the
import does not take is memory the metrics pass can give DuckDB. So the tests live here, in ``math``
and numpy.
Each function states the definition it computes; ``tests/test_exact_tests.py`` cross-checks every one
against scipy (and against exact rational arithmetic where that is possible).

- ``fisher_exact_2x2``: two-sided Fisher exact test of a 2x2 table and its sample odds ratio.
- ``binom_cdf_half`` / ``chi2_sf_1df``: the two tails McNemar's test needs.
- ``spearman_rho_p``: Spearman's rank correlation with the Student-t p-value, via ``betainc``, the
  regularized incomplete beta function.
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np

# A table counts as "no more likely than the observed one" when its probability is at most the observed
# one's, exactly (scipy.stats.fisher_exact's definition; its 1 + 1e-14 factor only absorbs rounding).
# The floating-point log-probabilities below are good to about 1e-13 relative (tables equally likely in
# exact arithmetic, e.g. mirror images, came out up to 2.3e-13 apart at margins 10^3 to 2*10^6), so
# every table within FISHER_BORDERLINE (relative) of the observed one is decided again from the exact
# ratio of the two probabilities, a product of the rational steps between them evaluated with
# _BORDERLINE_DIGITS significant digits (a tie then compares equal to far beyond any rounding). A
# looser tolerance would change p on real tables: with 1 + 1e-7 (R's fisher.test), the table of total
# 204, rows 58 / 146 and columns 60 / 144 observed at x = 20 counts x = 14, which is 8.4e-8 more
# likely, and p is 0.394 instead of 0.314 (tests/test_exact_tests.py pins it against exact rationals).
FISHER_BORDERLINE = 1e-9
_BORDERLINE_DIGITS = 60

# Tables whose probability is below exp(-_NEGLIGIBLE_LOG) times the most likely table's are left out
# of the sums: even 1e12 of them add less than the smallest positive double to a p-value (whose
# denominator, the sum over all tables relative to the mode, is at least 1).
_NEGLIGIBLE_LOG = 800.0

# binom_cdf_half sums exact binomial coefficients up to this many trials; beyond it the big-integer
# sums get slow (quadratic in n: 60 ms at n = 30000) and a floating-point sum takes over.
_BINOM_EXACT_MAX_N = 1 << 14

# betainc takes log B(a, b) from exact factorials when 2a and 2b are integers and a + b is at most this
# (the rational part of B then stays well inside the range of a double), else from math.lgamma.
_EXACT_BETA_MAX = 600


def _log_choose(n: int, k: int) -> float:
    """log C(n, k) via lgamma: good to ~1e-16 * log(n!) absolute, enough to place a window, not to sum."""
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def fisher_exact_2x2(a: int, b: int, c: int, d: int) -> tuple[float, float]:
    """Two-sided Fisher exact test of the table [[a, b], [c, d]]: (sample odds ratio, p).

    Odds ratio: a*d / (b*c); ``inf`` when b*c == 0 (then a*d > 0 because no margin is empty), ``nan``
    when a row or column sums to 0 (the ratio is 0/0 or undefined), in which case p = 1: only one
    table has those margins. These are scipy.stats.fisher_exact's conventions.

    p: with the margins fixed, a follows the hypergeometric law P(x) = C(a+b, x) C(c+d, a+c-x) /
    C(n, a+c). p is the total probability of every table x with P(x) <= P(a), capped at 1 (ties within
    rounding decided exactly: see FISHER_BORDERLINE).

    Computation: P(x) / P(mode) comes from the exact ratio P(x+1)/P(x) = (r1-x)(c1-x) / ((x+1)(r2-c1+x+1)),
    whose logs are accumulated outward from the mode (numpy, vectorised), so no huge log-factorials
    cancel; p = (sum of qualifying terms) / (sum of all terms), the normalising binomial never needed.
    Only the window where P(x) > exp(-800) P(mode) is summed (found by bisection on the lgamma form of
    log P): whatever lies outside cannot change a double. If the observed table lies outside it, p is
    below the smallest double and is returned as 0.0. Cost: O(sigma) for a hypergeometric standard
    deviation sigma: 0.24 ms for [[30000, 25000], [28000, 27000]], ~3 ms with every margin 2*10^6.
    """
    if min(a, b, c, d) < 0:
        raise ValueError(f"table counts must be non-negative, got {[[a, b], [c, d]]}")
    a, b, c, d = int(a), int(b), int(c), int(d)
    r1, r2, c1, c2 = a + b, c + d, a + c, b + d
    if 0 in (r1, r2, c1, c2):
        return float("nan"), 1.0
    odds = math.inf if b * c == 0 else (a * d) / (b * c)  # Python ints: one correctly rounded division

    lo, hi = max(0, c1 - r2), min(r1, c1)  # the support of x
    mode = min(max((r1 + 1) * (c1 + 1) // (r1 + r2 + 2), lo), hi)
    log_mode = _log_choose(r1, mode) + _log_choose(r2, c1 - mode)

    def rough(x: int) -> float:  # log P(x) - log P(mode), lgamma form
        return _log_choose(r1, x) + _log_choose(r2, c1 - x) - log_mode

    # window [left, right]: P is monotone on each side of the mode, so bisection finds the edges
    left, right = lo, hi
    if rough(lo) < -_NEGLIGIBLE_LOG:
        out, inn = lo, mode  # rough(out) < -limit <= rough(inn)
        while inn - out > 1:
            mid = (out + inn) // 2
            out, inn = (out, mid) if rough(mid) >= -_NEGLIGIBLE_LOG else (mid, inn)
        left = inn
    if rough(hi) < -_NEGLIGIBLE_LOG:
        inn, out = mode, hi
        while out - inn > 1:
            mid = (out + inn) // 2
            inn, out = (mid, out) if rough(mid) >= -_NEGLIGIBLE_LOG else (inn, mid)
        right = inn
    if not left <= a <= right:
        return odds, 0.0

    # log(P(x+1)/P(x)) for x = left .. right-1, as log1p of an exactly formed difference
    x = np.arange(left, right, dtype=np.float64)
    num = (r1 - x) * (c1 - x)
    den = (x + 1.0) * (r2 - c1 + x + 1.0)
    step = np.log1p((num - den) / den)
    k = mode - left
    logp = np.empty(right - left + 1)
    logp[k] = 0.0
    logp[k + 1 :] = np.cumsum(step[k:])
    logp[:k] = -np.cumsum(step[:k][::-1])[::-1]

    obs = logp[a - left]
    qualifies = logp <= obs
    for i in np.flatnonzero(np.abs(logp - obs) <= FISHER_BORDERLINE):
        qualifies[i] = _no_more_likely(left + int(i), a, r1, r2, c1)
    if qualifies.all():
        return odds, 1.0  # every table is at most as likely as the observed one: p is the whole mass
    terms = np.exp(logp)
    p = float(terms[qualifies].sum()) / float(terms.sum())
    return odds, min(1.0, p)


def _no_more_likely(x: int, a: int, r1: int, r2: int, c1: int) -> bool:
    """Whether P(x) <= P(a) for the hypergeometric law of ``fisher_exact_2x2``, decided from the ratio
    P(x) / P(a): the product of the exact steps P(t+1) / P(t) = (r1-t)(c1-t) / ((t+1)(r2-c1+t+1))
    between them, numerator and denominator each a product of integers taken to _BORDERLINE_DIGITS
    digits. Only called for tables whose floating-point probability is within FISHER_BORDERLINE of
    the observed one's: rare, except the mirror image of the observed table when the two rows (or
    columns) have the same total, an exact tie known without the product. Otherwise the cost is about
    0.4 us per step of |x - a|."""
    if x == a:
        return True
    # equal row totals: P(x) = P(c1 - x) (swap the rows); equal column totals: P(x) = P(r1 - x)
    # (swap the columns). Either symmetry mapping the observed table onto x is an exact tie.
    if (r1 == r2 and x == c1 - a) or (2 * c1 == r1 + r2 and x == r1 - a):
        return True
    lo, hi = min(x, a), max(x, a)
    with decimal.localcontext() as ctx:
        ctx.prec = _BORDERLINE_DIGITS
        # the products pass 10^999999 (the default exponent limit) once |x - a| reaches about 70,000
        ctx.Emax, ctx.Emin = decimal.MAX_EMAX, decimal.MIN_EMIN
        up, down = decimal.Decimal(1), decimal.Decimal(1)
        for t in range(lo, hi):
            up *= (r1 - t) * (c1 - t)
            down *= (t + 1) * (r2 - c1 + t + 1)
        # P(hi) / P(lo) = up / down; x is the lower end when x < a
        ratio = up / down if x > a else down / up
        # each rounded product is off by at most ~(hi - lo) units in the 60th digit: a tie stays
        # within 1e-40 of 1, and a real difference that small would be beyond any data's precision
        return ratio <= 1 + decimal.Decimal("1e-40")


def _log_central_binomial(h: int) -> float:
    """log(C(2h, h) / 4^h) for h >= 8192 from its asymptotic series: C(2h, h) / 4^h =
    Gamma(h + 1/2) / (sqrt(pi) Gamma(h + 1)) = (pi h)^(-1/2) (1 - 1/(8h) + 1/(128h^2) + 5/(1024h^3)
    - 21/(32768h^4) + O(h^-5)); the first omitted term is below 1e-19 relative at h = 8192."""
    inv = 1.0 / h
    series = 1.0 + inv * (-1 / 8 + inv * (1 / 128 + inv * (5 / 1024 - inv * 21 / 32768)))
    return math.log(series) - 0.5 * math.log(math.pi * h)


def _binom_cdf_half_large(k: int, n: int) -> float:
    """P(X <= k), X ~ Binomial(n, 1/2), n > 2^14, 0 <= k < n, in floating point.

    The lower tail (k < n/2; the upper one by symmetry, P(X <= k) = 1 - P(X <= n - k - 1)) is the
    pmf at k times sum_{i<=k} P(i) / P(k). P(k) is anchored at the mode h = floor(n/2), whose
    probability has a precise asymptotic series (``_log_central_binomial``), and reached by the exact
    ratios P(t) / P(t+1) = (t+1) / (n-t), summed in log space (pairwise); the terms below k by a short
    cumulative sum of the same logs. Relative error ~1e-16 * (1 + |log P(k)|) * log(n), against
    ~1e-16 * log(n!) for an lgamma-based pmf. Tails beyond exp(-760) (Chernoff bound
    exp(-n KL(k/n || 1/2))) are below the smallest double and return 0.0.
    """
    if 2 * k >= n:
        return 1.0 - _binom_cdf_half_large(n - k - 1, n)
    q = k / n
    kl = math.log(2.0) if k == 0 else q * math.log(2 * q) + (1 - q) * math.log(2 * (1 - q))
    if n * kl > 760.0:
        return 0.0
    h = n // 2
    log_pmf_mode = _log_central_binomial(h)
    if n % 2:  # P(h) = C(2h+1, h) / 2^(2h+1) = C(2h, h) / 4^h * (2h + 1) / (2h + 2)
        log_pmf_mode += math.log((2 * h + 1) / (2 * h + 2))
    # below k the pmf falls at least as fast as a normal with sd sqrt(n)/2: 41 sd is under exp(-800)
    lo = max(0, k - math.ceil(41 * math.sqrt(n) / 2) - 10)
    t = np.arange(lo, h, dtype=np.float64)
    step = np.log1p((2 * t + 1 - n) / (n - t))  # log P(t) / P(t+1)
    log_pmf_k = float(step[k - lo :].sum()) + log_pmf_mode
    below = np.cumsum(step[: k - lo][::-1])  # log P(i) / P(k) for i = k-1, k-2, ..., lo
    return math.exp(log_pmf_k) * (1.0 + float(np.exp(below).sum()))


def binom_cdf_half(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2): sum_{i<=k} C(n, i) / 2^n.

    Exact up to n = 2^14: the integer sum divided by 2^n is one correctly rounded division (up to
    about 40 ms at the top; the cost grows as n k). McNemar calls it with n < 25. Larger n are summed
    in floating point (``_binom_cdf_half_large``).
    """
    k, n = int(k), int(n)  # numpy integers would wrap in the products and shifts below
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if n <= _BINOM_EXACT_MAX_N:
        total, term = 0, 1  # term = C(n, i)
        for i in range(k + 1):
            total += term
            term = term * (n - i) // (i + 1)
        return total / (1 << n)
    return _binom_cdf_half_large(k, n)


def chi2_sf_1df(x: float) -> float:
    """Upper tail P(Q > x) of the chi-square law with one degree of freedom.

    Q = Z^2 for a standard normal Z, so P(Q > x) = P(|Z| > sqrt(x)) = erfc(sqrt(x / 2)); 1 for x <= 0.
    """
    if math.isnan(x):
        return math.nan
    if x <= 0:
        return 1.0
    return math.erfc(math.sqrt(x / 2.0))


def _log_beta(a: float, b: float) -> float:
    """log B(a, b) = log Gamma(a) + log Gamma(b) - log Gamma(a + b).

    For integer or half-integer a and b (the Student-t and binomial cases) the Gamma values are
    rationals times powers of sqrt(pi): Gamma(m) = (m-1)!, Gamma(m + 1/2) = (2m)! sqrt(pi) / (4^m m!).
    Forming the rational exactly and rounding once avoids the cancellation between the three lgamma
    terms, which costs ~1e-16 * log Gamma(a + b) absolute otherwise.
    """
    if (2 * a).is_integer() and (2 * b).is_integer() and a + b <= _EXACT_BETA_MAX:

        def gamma_rational(v: float) -> tuple[Fraction, int]:  # Gamma(v) = rational * sqrt(pi)^power
            if v.is_integer():
                return Fraction(math.factorial(int(v) - 1)), 0
            m = int(v - 0.5)
            return Fraction(math.factorial(2 * m), 4**m * math.factorial(m)), 1

        (ga, pa), (gb, pb), (gab, pab) = gamma_rational(a), gamma_rational(b), gamma_rational(a + b)
        half_pi_powers = pa + pb - pab  # 0, or 2 when a and b are both half-integers
        return math.log(float(ga * gb / gab)) + half_pi_powers * 0.5 * math.log(math.pi)
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _beta_continued_fraction(a: float, b: float, x: float, y: float) -> float:
    """I_x(a, b) from its continued fraction, for x < (a + 1) / (a + b + 2) where it converges fast.

    I_x(a, b) = x^a y^b / (a B(a, b)) * 1 / (1 + d1 / (1 + d2 / (1 + ...))), y = 1 - x, with
    d_{2m+1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1)),
    d_{2m} = m (b - m) x / ((a + 2m - 1)(a + 2m)) (DLMF 8.17.22), evaluated by the modified Lentz method.
    """
    tiny = 1e-300
    f = c = 1.0  # f = 1 + d1/(1 + d2/(...)), b0 = 1
    dd = 0.0
    for j in range(1, 100_000):
        m = j // 2
        if j % 2:
            coef = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            coef = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        dd = 1.0 + coef * dd
        dd = 1.0 / (dd if abs(dd) > tiny else tiny)
        c = 1.0 + coef / c
        c = c if abs(c) > tiny else tiny
        delta = c * dd
        f *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    else:  # pragma: no cover - the fraction converges in O(sqrt(max(a, b))) steps
        raise ArithmeticError(f"incomplete beta continued fraction did not converge for a={a}, b={b}, x={x}")
    log_front = a * math.log(x) + b * math.log(y) - math.log(a) - _log_beta(a, b)
    return math.exp(log_front) / f


def betainc(a: float, b: float, x: float, y: float | None = None) -> float:
    """Regularized incomplete beta I_x(a, b) = B(x; a, b) / B(a, b), for a, b > 0 and 0 <= x <= 1.

    ``y`` is 1 - x when the caller knows it more precisely than ``1 - x`` rounds (e.g. r^2 next to
    (1 - r)(1 + r)); near x = 1 that difference is most of the answer's precision. Below
    x = (a + 1) / (a + b + 2) the continued fraction is used directly; above it the symmetry
    I_x(a, b) = 1 - I_{1-x}(b, a), so the fraction is always evaluated where it converges quickly.
    For b of order 1 (Spearman's b = 1/2) the fraction then gives the smaller tail, or one no smaller
    than about 0.08, so little precision is lost to the subtraction; for very small b (e.g. 1e-5 at
    a = 5e4) the switch point is far from the median and the result near it loses several digits.
    With a + b > ``_EXACT_BETA_MAX`` log B comes from lgamma, good to about 1e-16 log Gamma(a + b)
    absolute (Spearman's p then agrees with scipy to about 3e-11 relative at n = 10^5).
    """
    a, b, x = float(a), float(b), float(x)
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a, b > 0, got a={a}, b={b}")
    y = 1.0 - x if y is None else float(y)
    if math.isnan(x) or math.isnan(y) or x < 0 or y < 0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got x={x}")
    if x == 0:
        return 0.0
    if y == 0:
        return 1.0
    if x < (a + 1) / (a + b + 2):
        return _beta_continued_fraction(a, b, x, y)
    return 1.0 - _beta_continued_fraction(b, a, y, x)


def _twice_average_ranks(v: np.ndarray) -> np.ndarray:
    """2 x the average ranks of v (1-based; tied values share the mean of their positions), as int64.

    Average ranks are multiples of 1/2, so doubling makes them integers and the correlation sums exact.
    """
    order = np.argsort(v, kind="stable")
    s = v[order]
    new = np.r_[True, s[1:] != s[:-1]]  # sorted position starts a distinct value
    starts = np.flatnonzero(new)  # first sorted position of each distinct value
    ends = np.r_[starts[1:], len(v)]  # one past its last
    group = np.cumsum(new) - 1
    twice = np.empty(len(v), dtype=np.int64)
    # positions starts..ends-1 (0-based) hold ranks starts+1..ends: their mean doubled is starts + ends + 1
    twice[order] = (starts + ends + 1)[group]
    return twice


def _int_dot(u: np.ndarray, v: np.ndarray) -> int:
    """sum(u * v) of two int64 vectors of doubled ranks (each at most 2n), exactly, as a Python int.

    One int64 sum would wrap once the total passes 2^63 (about n = 1.5 million for sum(rank^2)), so
    the products are summed in chunks small enough for int64 and the chunk sums added in Python."""
    n = len(u)
    chunk = max(1, (1 << 62) // max(1, 4 * n * n))  # each product is at most (2n)^2
    return sum(int(np.dot(u[i : i + chunk], v[i : i + chunk])) for i in range(0, n, chunk))


def spearman_rho_p(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Spearman's rho and its two-sided p-value, the quantities scipy.stats.spearmanr reports.

    rho is the Pearson correlation of the average ranks (ties share the mean rank). The ranks, doubled,
    are integers, so the centred sums n*sum(xy) - sum(x)sum(y) etc. are formed exactly in Python
    integers and rho is rounded only a few times: a perfect monotone relation gives exactly +-1.
    p: t = rho sqrt((n - 2) / (1 - rho^2)) has Student's t law with n - 2 degrees of freedom under
    independence (the usual large-sample approximation), and P(|T| > |t|) = I_w(df/2, 1/2) with
    w = df / (df + t^2) = (1 - rho)(1 + rho); |rho| = 1 gives p = 0.
    Degenerate inputs: NaN anywhere or a constant input gives (nan, nan); n = 2 gives (rho, nan)
    (no degrees of freedom); n < 2 gives (nan, nan).
    """
    xv, yv = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if len(xv) != len(yv):
        raise ValueError(f"x and y differ in length: {len(xv)} vs {len(yv)}")
    n = len(xv)
    if n < 2 or np.isnan(xv).any() or np.isnan(yv).any():
        return math.nan, math.nan
    rx, ry = _twice_average_ranks(xv), _twice_average_ranks(yv)
    sx, sy = int(rx.sum()), int(ry.sum())
    sxx = n * _int_dot(rx, rx) - sx * sx
    syy = n * _int_dot(ry, ry) - sy * sy
    sxy = n * _int_dot(rx, ry) - sx * sy
    if sxx == 0 or syy == 0:
        return math.nan, math.nan
    prod = sxx * syy
    # a perfect monotone relation is exactly +-1; otherwise one division, clipped against rounding
    rho = math.copysign(1.0, sxy) if sxy * sxy == prod else max(-1.0, min(1.0, sxy / math.sqrt(prod)))
    if n == 2:
        return rho, math.nan
    if abs(rho) == 1.0:
        return rho, 0.0
    # 1 - rho^2 and rho^2 as exact ratios of integers, each rounded once (int / int is correctly rounded)
    return rho, betainc((n - 2) / 2.0, 0.5, (prod - sxy * sxy) / prod, (sxy * sxy) / prod)

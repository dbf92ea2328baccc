"""The statistics of ``gpuq report``, stdlib only (the controller carries no numpy or scipy).

Student's t distribution through the regularized incomplete beta function (a continued fraction
evaluated with the modified Lentz method), the 95 % confidence interval of a mean, and Welch's
unequal-variance comparison of two means (Welch-Satterthwaite degrees of freedom).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
_EPS = 1e-15
_TINY = 1e-300


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean; finite for any finite values (a sum past the float range is taken in
    units of a power of two near the largest instead: 1.5e308 and 1.5e308 average to 1.5e308)."""
    if not values:
        raise ValueError("mean of no values")
    try:
        total = math.fsum(values) / len(values)
    except OverflowError:
        total = math.inf
    if math.isfinite(total):
        return total
    k = _scale(values)
    return math.fsum(v / k for v in values) / len(values) * k


def _scale(values: Sequence[float]) -> float:
    """A power of two near the largest magnitude among ``values`` (1.0 when all are 0): dividing by
    it is exact and keeps every square in range."""
    top = max((abs(v) for v in values), default=0.0)
    return math.ldexp(1.0, math.frexp(top)[1] - 1) if top > 0.0 else 1.0


def std(values: Sequence[float]) -> float | None:
    """Sample standard deviation (n - 1 in the denominator); None below two values, and None when it
    cannot be computed: the values' spread exceeds the float range (``finite`` says which)."""
    if len(values) < 2:
        return None
    k = _scale(values)
    scaled = [v / k for v in values]
    m = math.fsum(scaled) / len(scaled)
    out = math.sqrt(math.fsum((v - m) ** 2 for v in scaled) / (len(scaled) - 1)) * k
    return out if math.isfinite(out) else None


def finite(*numbers: float | None) -> bool:
    """True when every number is given and finite: the statistic could be computed."""
    return all(n is not None and math.isfinite(n) for n in numbers)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        step = d * c
        h *= step
        if abs(step - 1.0) < _EPS:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x={x} outside [0, 1]")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` > 0 degrees of freedom (df need not be whole: Welch)."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, not {df}")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, by bisection on ``t_cdf`` (to 1e-12 relative); each (p, df) is
    solved once (a report's cells mostly share their number of seeds)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p} outside (0, 1)")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    below = _below(p, df, lo, hi)
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if below(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


_BAND = 1e-10  # relative: t_cdf is evaluated only this close to the root


def _below(p: float, df: float, lo: float, hi: float) -> Callable[[float], bool]:
    """The bisection's question, ``t_cdf(x, df) < p``, for the root in [lo, hi].  Far from the root the
    answer is known: a few Newton steps find the root, two evaluations confirm that t_cdf crosses p
    within ``_BAND`` of it, and only points inside that band are evaluated (about 20 evaluations of the
    incomplete beta function instead of 45; the bisection takes the very same steps, since t_cdf
    rises with x and its error, near 1e-15, is far below its change over the band)."""
    root = _newton(p, df, lo, hi)
    if root is not None:
        low, high = root * (1.0 - _BAND), root * (1.0 + _BAND)
        if t_cdf(low, df) < p <= t_cdf(high, df):
            return lambda x: x < low or (x <= high and t_cdf(x, df) < p)
    return lambda x: t_cdf(x, df) < p


def _newton(p: float, df: float, lo: float, hi: float) -> float | None:
    """The root of t_cdf(x, df) = p in [lo, hi] to about 1e-11 relative (Newton steps on the t density,
    a bisection step where one would leave the bracket); None if it does not settle in a few steps."""
    log_scale = math.lgamma((df + 1.0) / 2.0) - math.lgamma(df / 2.0) - 0.5 * math.log(df * math.pi)
    x = (lo + hi) / 2.0
    for _ in range(12):
        gap = t_cdf(x, df) - p
        if gap < 0.0:
            lo = x
        else:
            hi = x
        density = math.exp(log_scale - (df + 1.0) / 2.0 * math.log1p(x * x / df))
        step = gap / density if density > 0.0 else math.inf
        if abs(step) <= 1e-11 * x:
            return x
        x = x - step if lo < x - step < hi else (lo + hi) / 2.0
    return None


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def mean_ci(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """The Student-t confidence interval of the mean; None below two values, or when its bounds
    lie outside the float range (cannot be computed)."""
    s = std(values)
    if s is None:
        return None
    n = len(values)
    k = _scale(values)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * (s / k) / math.sqrt(n)
    m = mean(values) / k
    low, high = (m - half) * k, (m + half) * k
    return Interval(low, high) if finite(low, high) else None


@dataclass(frozen=True)
class Welch:
    """Welch's comparison of two means: ``delta`` = mean(a) - mean(b)."""

    delta: float
    ci: Interval
    p_value: float
    df: float | None  # None when both samples have zero variance


def welch(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE) -> Welch | None:
    """Welch's t-test of mean(a) - mean(b); None unless both sides have at least two values, and
    None when the difference or its interval lies outside the float range (cannot be computed).

    Both samples without variance (every seed gave the same number): the difference is exact, so
    its interval is the point itself and the p-value is 0 when the means differ, 1 when they do not.
    Computed on the values divided by the largest magnitude (the test does not depend on the
    scale), so huge finite values neither overflow nor turn into NaN.
    """
    if len(a) < 2 or len(b) < 2:
        return None
    k = _scale([*a, *b])
    a_s, b_s = [v / k for v in a], [v / k for v in b]
    sa, sb = std(a_s), std(b_s)
    if sa is None or sb is None:
        return None
    delta = mean(a_s) - mean(b_s)
    va, vb = sa * sa / len(a), sb * sb / len(b)
    se2 = va + vb
    if se2 == 0.0:
        exact = delta * k
        if not finite(exact):
            return None
        return Welch(exact, Interval(exact, exact), 0.0 if delta != 0.0 else 1.0, None)
    df = se2 * se2 / ((va * va) / (len(a) - 1) + (vb * vb) / (len(b) - 1))
    se = math.sqrt(se2)
    half = t_quantile(0.5 + confidence / 2.0, df) * se
    p = 2.0 * (1.0 - t_cdf(abs(delta) / se, df))
    low, mid, high = (delta - half) * k, delta * k, (delta + half) * k
    if not finite(low, mid, high):
        return None
    return Welch(mid, Interval(low, high), min(1.0, max(0.0, p)), df)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of ``p_values`` (same order out): the k-th smallest is multiplied
    by (m - k + 1), made monotone, capped at 1.  Rejecting where adjusted p <= alpha holds the chance
    of any wrong verdict among the m at most alpha, whatever their dependence."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [1.0] * m
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (m - k) * p_values[i]))
        out[i] = running
    return out

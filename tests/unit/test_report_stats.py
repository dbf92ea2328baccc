"""gpuq report's statistics against values computed by other means: printed t tables, the closed
form of Student's t CDF for 4 degrees of freedom, and arithmetic done by hand in the comments."""

from __future__ import annotations

import math

import pytest

from orchestrator.report import stats


@pytest.mark.parametrize(("df", "expected"), [
    (1, 12.7062047362), (2, 4.30265272975), (3, 3.18244630528), (4, 2.7764451052), (10, 2.22813885196),
    (30, 2.04227245630),
])
def test_t_quantile_matches_the_printed_table(df: int, expected: float) -> None:
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-8)
    assert stats.t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-8)


@pytest.mark.parametrize("t", [-7.5, -2.0, -0.3, 0.0, 0.7, 1.5, 6.12372436])
def test_t_cdf_for_four_degrees_of_freedom_is_the_closed_form(t: float) -> None:
    # nu = 4: F(t) = 1/2 + t (t^2 + 6) / (2 (t^2 + 4)^(3/2))
    closed = 0.5 + t * (t * t + 6) / (2 * (t * t + 4) ** 1.5)
    assert stats.t_cdf(t, 4) == pytest.approx(closed, abs=1e-12)


def test_t_cdf_for_one_degree_of_freedom_is_the_cauchy() -> None:
    for t in (-3.0, 0.5, 10.0):
        assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)


def test_mean_std_and_ci_by_hand() -> None:
    values = [0.80, 0.82, 0.84]
    assert stats.mean(values) == pytest.approx(0.82)
    assert stats.std(values) == pytest.approx(0.02)  # sqrt((0.0004 + 0 + 0.0004) / 2)
    ci = stats.mean_ci(values)
    assert ci is not None
    half = 4.30265272975 * 0.02 / math.sqrt(3)  # 0.0496827...
    assert (ci.low, ci.high) == (pytest.approx(0.82 - half), pytest.approx(0.82 + half))


def test_one_value_has_no_spread() -> None:
    assert stats.std([0.5]) is None and stats.mean_ci([0.5]) is None
    assert stats.welch([0.5], [0.4, 0.6]) is None and stats.welch([0.4, 0.6], [0.5]) is None
    with pytest.raises(ValueError):
        stats.mean([])


def test_welch_equal_variances_by_hand() -> None:
    # a = [0.90, 0.92, 0.94], b = [0.80, 0.82, 0.84]: each var/n = 0.0004/3, se = sqrt(0.0008/3) = 0.0163299,
    # df = (2v)^2 / (v^2/2 + v^2/2) = 4, t = 0.1 / 0.0163299 = 6.12372
    test = stats.welch([0.90, 0.92, 0.94], [0.80, 0.82, 0.84])
    assert test is not None
    se = math.sqrt(0.0008 / 3)
    assert test.delta == pytest.approx(0.10)
    assert test.df == pytest.approx(4.0)
    assert (test.ci.low, test.ci.high) == (pytest.approx(0.10 - 2.7764451052 * se),
                                           pytest.approx(0.10 + 2.7764451052 * se))
    t = 0.10 / se
    assert test.p_value == pytest.approx(1 - t * (t * t + 6) / (t * t + 4) ** 1.5, rel=1e-9)  # 2 (1 - F(t))
    assert test.p_value == pytest.approx(0.0036022, abs=1e-6)  # 1 - 266.38201/267.34505


def test_welch_unequal_sizes_use_the_satterthwaite_df() -> None:
    # a = [0.13, 0.15] (var/n = 0.0002/2 = 1e-4), b = [0.80, 0.82, 0.84] (var/n = 0.0004/3):
    # df = (1e-4 + 1.3333e-4)^2 / ((1e-4)^2 / 1 + (1.3333e-4)^2 / 2) = (49/9) / (17/9) = 49/17
    test = stats.welch([0.13, 0.15], [0.80, 0.82, 0.84])
    assert test is not None
    assert test.df == pytest.approx(49 / 17)
    assert test.delta == pytest.approx(-0.68)
    assert test.ci.high < 0 and test.p_value < 0.001


def test_welch_without_variance_is_exact() -> None:
    same = stats.welch([0.5, 0.5], [0.5, 0.5, 0.5])
    differ = stats.welch([0.6, 0.6], [0.5, 0.5])
    assert same is not None and (same.delta, same.p_value, same.df) == (0.0, 1.0, None)
    assert differ is not None and differ.p_value == 0.0
    assert (differ.ci.low, differ.ci.high) == (pytest.approx(0.1), pytest.approx(0.1))


def test_betainc_edges_and_symmetry() -> None:
    assert stats.betainc(2.0, 3.0, 0.0) == 0.0 and stats.betainc(2.0, 3.0, 1.0) == 1.0
    # I_x(a, b) = 1 - I_{1-x}(b, a); I_x(1, 1) = x; I_x(2, 1) = x^2
    assert stats.betainc(2.5, 0.5, 0.3) == pytest.approx(1 - stats.betainc(0.5, 2.5, 0.7), abs=1e-13)
    assert stats.betainc(1.0, 1.0, 0.37) == pytest.approx(0.37, abs=1e-13)
    assert stats.betainc(2.0, 1.0, 0.6) == pytest.approx(0.36, abs=1e-13)
    with pytest.raises(ValueError):
        stats.betainc(1.0, 1.0, 1.5)

"""Statistics over seeds: t-intervals, paired t-tests and Kendall's τ-b (scipy.stats)."""

from __future__ import annotations

import math

import pytest

from pe_bench.harness.reports.stats import kendall_tau_b, paired_p_value, t_interval


def test_t_interval_matches_the_textbook_value():
    low, high = t_interval([90.0, 92.0, 91.0], 0.95)
    # t_{0.975, 2} = 4.3027; s = 1; n = 3
    assert (low + high) / 2 == pytest.approx(91.0)
    assert (high - low) / 2 == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    assert all(math.isnan(x) for x in t_interval([90.0], 0.95))
    with pytest.raises(ValueError, match="0.95"):
        t_interval([1.0, 2.0], 95)


def test_paired_test_uses_only_the_seeds_both_hold():
    a = {0: 90.0, 1: 92.0, 2: 91.0, 7: 10.0}
    b = {0: 91.0, 1: 89.0, 2: 90.5, 9: 99.0}
    # by hand: differences -1, 3, 0.5; mean 0.8333, sd 2.0207, t = 0.7143 on 2 dof -> p = 0.5490
    assert paired_p_value(a, b) == pytest.approx(0.5490, abs=1e-3)
    assert math.isnan(paired_p_value({0: 1.0, 1: 2.0}, {1: 2.5, 2: 3.0}))  # one shared seed: no test
    assert paired_p_value({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0}) == 1.0  # identical on every seed
    assert paired_p_value({0: 1.0, 1: 2.0}, {0: 3.0, 1: 4.0}) == 0.0  # one constant difference


def test_kendall_tau_b_with_ties_and_p_value():
    tau, p = kendall_tau_b([1.0, 2.0, 3.0], [10.0, 20.0, 30.0])
    assert tau == pytest.approx(1.0) and p == pytest.approx(1 / 3)
    # tau-b with one tie: (C - D) / sqrt((n0 - n1)(n0 - n2)) = (2 - 0) / sqrt(3 * 2)
    tau, _ = kendall_tau_b([1.0, 2.0, 2.0], [1.0, 2.0, 3.0])
    assert tau == pytest.approx(2 / math.sqrt(6))
    assert all(math.isnan(x) for x in kendall_tau_b([1.0, 1.0], [1.0, 2.0]))
    with pytest.raises(ValueError, match="one length"):
        kendall_tau_b([1.0], [1.0, 2.0])

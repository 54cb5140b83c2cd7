"""Statistics over seeds for the result tables, all from ``scipy.stats``.

- ``t_interval``: Student's t confidence interval of a mean over seeds.
- ``paired_p_value``: two-sided paired t-test (``ttest_rel``) over the seeds two cells share.
- ``kendall_tau_b``: Kendall's rank correlation, variant b (ties in either ranking handled).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import stats

NAN = float("nan")


def t_interval(scores: Sequence[float], level: float) -> tuple[float, float]:
    """(low, high) of the ``level`` (e.g. 0.95) t-interval of the mean; NaN for fewer than 2 scores.

    mean ± t_{(1+level)/2, n-1} · s / √n, with s the sample standard deviation (ddof = 1).
    """
    if not 0 < level < 1:
        raise ValueError(f"confidence level must lie in (0, 1), got {level!r} (95 % is 0.95)")
    values = np.asarray(scores, dtype=float)
    if len(values) < 2:
        return NAN, NAN
    mean = float(values.mean())
    half = float(stats.t.ppf((1 + level) / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    return mean - half, mean + half


def paired_p_value(a: Mapping[int, float], b: Mapping[int, float]) -> float:
    """Two-sided p-value of a paired t-test between two cells over the seeds both hold.

    NaN with fewer than 2 shared seeds (no test). Where the per-seed differences are all equal
    the t statistic is 0/0 or x/0 and scipy returns NaN; we return 1.0 for identical scores on
    every seed (no difference at all) and 0.0 for one constant non-zero difference (every
    seed differs the same way).
    """
    shared = sorted(set(a) & set(b))
    if len(shared) < 2:
        return NAN
    x = np.array([a[s] for s in shared], dtype=float)
    y = np.array([b[s] for s in shared], dtype=float)
    differences = x - y
    scale = max(1.0, float(np.abs(x).max()), float(np.abs(y).max()))
    if float(np.ptp(differences)) <= 1e-9 * scale:
        return 1.0 if abs(float(differences[0])) <= 1e-9 * scale else 0.0
    return float(stats.ttest_rel(x, y).pvalue)


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(τ-b, two-sided p-value) between two score lists over the same items; NaN for fewer than
    2 items or when one list is constant (no ranking to compare)."""
    if len(x) != len(y):
        raise ValueError(f"Kendall's tau needs lists of one length, got {len(x)} and {len(y)}")
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return NAN, NAN
    result = stats.kendalltau(x, y, variant="b")
    return float(result.statistic), float(result.pvalue)

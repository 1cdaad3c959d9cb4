"""Intervals over a handful of independent units (documents, seeds) that reach their nominal coverage, and the
inference policy that picks one by the number of units.

With ``n`` units a percentile bootstrap of a mean covers far less than its nominal level when ``n`` is small
(4 documents have only 35 distinct resamples); Student's t with ``n - 1`` degrees of freedom on the units'
own values is the interval whose coverage holds for a mean of near-normal unit values at any ``n >= 2``.
"""

from __future__ import annotations

import numpy as np
from scipy import stats


def t_interval(values, level: float = 0.95, axis: int = 0) -> dict[str, np.ndarray]:
    """Mean over independent units with Student's t interval (``n - 1`` degrees of freedom).

    Parameters
    ----------
    values : array_like
        One value per unit along ``axis`` (seeds, documents); NaN units are left out per column.
    level : float
        Two-sided coverage (0.95).

    Returns
    -------
    dict
        ``estimate`` (the mean), ``lo``, ``hi``, ``se`` (standard error), ``n`` (units used) and ``p``
        (two-sided p-value of the mean being zero), each with ``axis`` reduced. Fewer than two units
        give NaN end points: no interval is claimed from one unit.
    """
    x = np.moveaxis(np.asarray(values, dtype=np.float64), axis, 0)  # [unit, ...]
    n = np.isfinite(x).sum(0)
    mean = np.nanmean(np.where(n > 0, x, 0.0), 0) if x.size else np.full(x.shape[1:], np.nan)
    mean = np.where(n > 0, mean, np.nan)
    dev = np.where(np.isfinite(x), x - mean, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.sqrt((dev * dev).sum(0) / np.maximum(n - 1, 1) / np.maximum(n, 1))
        se = np.where(n >= 2, se, np.nan)
        dof = np.where(n >= 2, n - 1, np.nan)
        half = stats.t.ppf(0.5 + level / 2, dof) * se
        p = np.where(se > 0, 2 * stats.t.sf(np.abs(mean) / se, dof), np.where(mean == 0, 1.0, 0.0))
        p = np.where(n >= 2, p, np.nan)
    return {"estimate": mean, "lo": mean - half, "hi": mean + half, "se": se, "n": n, "p": p}


#: the policy's interval by the number of units: below ``JACKKNIFE_BELOW`` units the jackknife-t interval,
#: whose coverage reaches the target where a bootstrap of a few units cannot (4 documents have only 35
#: distinct resamples); from there on BCa (``benchmarks/bench_coverage.py`` measures both, data/coverage.csv)
JACKKNIFE_BELOW = 8
POLICY_INTERVALS = ("jackknife_t", "bca")


def interval_policy(n_units: int) -> str:
    """The name of the interval the inference policy reports for ``n_units`` independent units.

    ``"jackknife_t"`` below :data:`JACKKNIFE_BELOW` units, ``"bca"`` from there on. Units are what varies
    independently: documents for a capture's statistics, seeds for anything trained; windows cut from one
    document are not independent of each other.
    """
    if n_units < 2:
        raise ValueError(f"an interval needs at least two independent units, got {n_units}")
    return "jackknife_t" if n_units < JACKKNIFE_BELOW else "bca"


def jackknife_t(estimate, jackknife, level: float = 0.95) -> dict[str, np.ndarray]:
    """Jackknife-t interval: ``estimate +- t_{n-1} se_jack`` from the ``n`` leave-one-unit-out values.

    Parameters
    ----------
    estimate : array_like
        The statistic on all units (``[...]``).
    jackknife : array_like ``[unit, ...]``
        The statistic with each unit left out in turn.
    level : float
        Two-sided coverage.

    Returns
    -------
    dict
        ``estimate``, ``lo``, ``hi``, ``se`` (``sqrt((n-1)/n sum (theta_i - theta_bar)^2)``, Tukey's jackknife
        standard error: for a mean it is the usual ``s / sqrt(n)``, so the interval is Student's t there),
        ``n`` (units with a finite value) and ``p`` (two-sided p-value of the statistic being zero,
        ``t = estimate / se`` on ``n - 1`` degrees of freedom). Fewer than two finite units give NaN.
    """
    est = np.asarray(estimate, dtype=np.float64)
    jack = np.asarray(jackknife, dtype=np.float64)  # [unit, ...]
    ok = np.isfinite(jack)
    n = ok.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, jack, 0.0).sum(0) / n
        dev = np.where(ok, jack - mean, 0.0)
        se = np.sqrt((n - 1) / n * (dev * dev).sum(0))
        se = np.where(n >= 2, se, np.nan)
        dof = np.where(n >= 2, n - 1, np.nan)
        half = stats.t.ppf(0.5 + level / 2, dof) * se
        p = np.where(se > 0, 2 * stats.t.sf(np.abs(est) / se, dof), np.where(est == 0, 1.0, 0.0))
        p = np.where(n >= 2, p, np.nan)
    return {"estimate": est, "lo": est - half, "hi": est + half, "se": se, "n": n, "p": p}

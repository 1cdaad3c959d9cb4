"""Intervals over a handful of independent units (documents, seeds) that reach their nominal coverage.

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

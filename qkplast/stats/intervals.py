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
    return _student(mean, se, n, level)


def _student(est, se, n, level: float) -> dict:
    """``est +- t_{n-1} se`` and the two-sided p-value of zero; NaN where fewer than two units."""
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.where(n >= 2, se, np.nan)
        dof = np.where(n >= 2, n - 1, np.nan)
        half = stats.t.ppf(0.5 + level / 2, dof) * se
        p = np.where(se > 0, 2 * stats.t.sf(np.abs(est) / se, dof), np.where(est == 0, 1.0, 0.0))
        p = np.where(n >= 2, p, np.nan)
    return {"estimate": est, "lo": est - half, "hi": est + half, "se": se, "n": n, "p": p}


#: the policy's interval by the number of units: below ``JACKKNIFE_BELOW`` units the bias-corrected jackknife-t
#: interval (``benchmarks/bench_coverage.py``, data/coverage.csv: at 4 documents the plasticity aggregates are
#: biased low by about their standard error, which a plain interval around the estimate misses and the
#: jackknife's bias correction removes; a bootstrap of a few documents covers far less, 4 documents having
#: only 35 distinct resamples and every resample repeating documents); from there on as well, until the
#: measured coverage shows another method reaching the target there
JACKKNIFE_BELOW = 8
POLICY_INTERVALS = ("jackknife_bc",)


def interval_policy(n_units: int) -> str:
    """The name of the interval the inference policy reports for ``n_units`` independent units.

    ``"jackknife_bc"``: the jackknife-t interval around the jackknife's bias-corrected estimate
    (:func:`jackknife_t` with ``bias_correct=True``), at every number of units measured so far (4, 8 and 16
    documents in ``data/coverage.csv``); the bootstrap's percentile and BCa intervals, whose resamples repeat
    documents and so shrink the between-document variance the plasticity aggregates depend on, cover less.
    Units are what varies independently: documents for a capture's statistics, seeds for anything trained;
    windows cut from one document are not independent of each other.
    """
    if n_units < 2:
        raise ValueError(f"an interval needs at least two independent units, got {n_units}")
    return "jackknife_bc"


def jackknife_t(estimate, jackknife, level: float = 0.95, bias_correct: bool = False) -> dict[str, np.ndarray]:
    """Jackknife-t interval: ``centre +- t_{n-1} se_jack`` from the ``n`` leave-one-unit-out values.

    The centre is the estimate, or with ``bias_correct`` Quenouille's bias-corrected estimate
    ``n estimate - (n - 1) mean(jackknife)``, which removes a bias of order ``1/n`` (the plasticity
    aggregates of a few documents have one: the spread between documents enters the query variances with
    the factor ``(n - 1)/n`` of a sample variance, so plasticity is too low).

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
        ``estimate`` (the centre: the bias-corrected estimate with ``bias_correct``), ``lo``, ``hi``, ``se``
        (``sqrt((n-1)/n sum (theta_i - theta_bar)^2)``, Tukey's jackknife standard error: for a mean it is
        the usual ``s / sqrt(n)``, and a mean has no bias to correct, so the interval is Student's t there),
        ``n`` (units with a finite value), ``bias`` (``(n - 1)(mean(jackknife) - estimate)``, the jackknife's
        estimate of the bias) and ``p`` (two-sided p-value of the centre being zero, ``t = centre / se`` on
        ``n - 1`` degrees of freedom). Fewer than two finite units give NaN.
    """
    est = np.asarray(estimate, dtype=np.float64)
    jack = np.asarray(jackknife, dtype=np.float64)  # [unit, ...]
    ok = np.isfinite(jack)
    n = ok.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, jack, 0.0).sum(0) / n
        dev = np.where(ok, jack - mean, 0.0)
        se = np.sqrt((n - 1) / n * (dev * dev).sum(0))
        bias = (n - 1) * (mean - est)
    out = _student(est - bias if bias_correct else est, se, n, level)
    out["bias"] = bias
    return out

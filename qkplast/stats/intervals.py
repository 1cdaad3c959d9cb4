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


#: the policy's interval by the number of units (``benchmarks/bench_coverage.py``, data/coverage.csv). The
#: plasticity aggregates of a few documents are biased low by about their standard error, which a plain interval
#: around the estimate misses and the jackknife's bias correction removes; a bootstrap of a few documents covers
#: far less (4 documents have only 35 distinct resamples and every resample repeats documents). The corrected
#: estimate varies more than the estimate (its own standard deviation, on the planted worlds at 4 documents), so
#: below ``JACKKNIFE_BELOW`` units its standard error comes from a jackknife of the corrected estimate itself
#: (leave-two-out values, at most 21 subsets); from there on the one-level jackknife standard error, the
#: difference having fallen to a few percent at 8 documents.
JACKKNIFE_BELOW = 8
POLICY_INTERVALS = ("jackknife_bc2", "jackknife_bc")


def interval_policy(n_units: int) -> str:
    """The name of the interval the inference policy reports for ``n_units`` independent units.

    ``"jackknife_bc2"`` from 3 units up to ``JACKKNIFE_BELOW - 1``: the jackknife-t interval around the jackknife's
    bias-corrected estimate with the standard error of that corrected estimate, from a second-level jackknife
    (:func:`jackknife_t` with ``jackknife2``; leave-two-out values). ``"jackknife_bc"`` with 2 units (where the
    two coincide: the correction's second level has no units left) and from ``JACKKNIFE_BELOW`` units on: the same
    centre with the one-level jackknife standard error. The bootstrap's percentile and BCa intervals, whose resamples
    repeat documents and so shrink the between-document variance the plasticity aggregates depend on, cover less.
    Units are what varies independently: documents for a capture's statistics, seeds for anything trained;
    windows cut from one document are not independent of each other.
    """
    if n_units < 2:
        raise ValueError(f"an interval needs at least two independent units, got {n_units}")
    return "jackknife_bc2" if 3 <= n_units < JACKKNIFE_BELOW else "jackknife_bc"


def needs_leave_two_out(n_units: int) -> bool:
    """Whether the policy's interval for ``n_units`` units needs the leave-two-out values (:func:`leave_two_out`)."""
    return interval_policy(n_units) == "jackknife_bc2"


def leave_two_out(n_units: int) -> np.ndarray:
    """The unit pairs ``[pair, 2]`` (``i < j``, in ``itertools.combinations`` order) whose joint removal gives the
    second-level jackknife's values; the order every ``jackknife2`` argument follows."""
    i, j = np.triu_indices(n_units, 1)
    return np.stack([i, j], -1)


def corrected_jackknife(jackknife, jackknife2) -> np.ndarray:
    """Leave-one-out values ``[unit, ...]`` of the bias-corrected estimate.

    With unit ``i`` left out, the ``n - 1`` remaining units give their own corrected estimate
    ``(n - 1) theta_(-i) - (n - 2) mean_{j != i} theta_(-i,-j)`` (Quenouille's correction applied to the
    sample without ``i``); ``jackknife2`` ``[pair, ...]`` holds ``theta_(-i,-j)`` in :func:`leave_two_out` order.
    """
    jack = np.asarray(jackknife, dtype=np.float64)  # [unit, ...]
    two = np.asarray(jackknife2, dtype=np.float64)  # [pair, ...]
    n = jack.shape[0]
    pairs = leave_two_out(n)
    if two.shape[0] != len(pairs):
        raise ValueError(f"{n} units have {len(pairs)} leave-two-out values, got {two.shape[0]}")
    member = np.zeros((n, len(pairs)))  # [unit, pair]: pair (i, j) is in the jackknife of the sample without i and j
    member[pairs[:, 0], np.arange(len(pairs))] = member[pairs[:, 1], np.arange(len(pairs))] = 1.0 / max(n - 1, 1)
    inner = np.tensordot(member, two, axes=(1, 0))  # [unit, ...]: mean over j != i of theta_(-i,-j)
    return (n - 1) * jack - (n - 2) * inner


def jackknife_t(estimate, jackknife, level: float = 0.95, bias_correct: bool = False,
                jackknife2=None) -> dict[str, np.ndarray]:
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
    jackknife2 : array_like ``[pair, ...]``, optional
        The statistic with each pair of units left out (:func:`leave_two_out` order). With ``bias_correct`` the
        standard error is then the jackknife standard error of the corrected estimate itself, from its
        leave-one-out values (:func:`corrected_jackknife`): the corrected estimate varies more than the
        estimate, which the one-level standard error does not see (the policy's ``"jackknife_bc2"``).

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
    if jackknife2 is not None and not bias_correct:
        raise ValueError("jackknife2 gives the standard error of the bias-corrected estimate: pass bias_correct=True")
    est = np.asarray(estimate, dtype=np.float64)
    jack = np.asarray(jackknife, dtype=np.float64)  # [unit, ...]
    mean, se, n = _jackknife_se(jack)
    with np.errstate(invalid="ignore"):
        bias = (n - 1) * (mean - est)
    if jackknife2 is not None:
        _, se, n = _jackknife_se(corrected_jackknife(jack, jackknife2))
    out = _student(est - bias if bias_correct else est, se, n, level)
    out["bias"] = bias
    return out


def _jackknife_se(jack: np.ndarray):
    """Mean, Tukey's standard error and number of finite units of leave-one-out values ``[unit, ...]``."""
    ok = np.isfinite(jack)
    n = ok.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(ok, jack, 0.0).sum(0) / n
        dev = np.where(ok, jack - mean, 0.0)
        se = np.sqrt((n - 1) / n * (dev * dev).sum(0))
    return mean, se, n


def policy_interval(estimate, jackknife, jackknife2=None, level: float = 0.95) -> dict[str, np.ndarray]:
    """The policy's interval (:func:`interval_policy`) for the ``len(jackknife)`` units of the leave-one-out values.

    ``jackknife2`` (the leave-two-out values, :func:`leave_two_out` order) is needed when the policy is
    ``"jackknife_bc2"`` (:func:`needs_leave_two_out`) and ignored otherwise. Returns :func:`jackknife_t`'s fields
    and ``interval`` (the method's name).
    """
    n_units = np.asarray(jackknife).shape[0]
    policy = interval_policy(n_units)
    if policy == "jackknife_bc2" and jackknife2 is None:
        raise ValueError(f"the policy's interval for {n_units} units needs the leave-two-out values (jackknife2)")
    out = jackknife_t(estimate, jackknife, level, bias_correct=True,
                      jackknife2=jackknife2 if policy == "jackknife_bc2" else None)
    out["interval"] = policy
    return out

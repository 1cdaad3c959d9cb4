"""Power of the seed-level t test: what a design of ``n`` seeds can detect at a given level.

A directional reading over seeds is decided by Student's t over the per-seed contrasts
(:func:`qkplast.stats.intervals.t_interval`, two-sided p-value) at the level Holm's step-down gives it
(:func:`qkplast.stats.decision.holm`). A reading left open with three seeds says little unless the smallest
effect the design could have detected is stated beside it: :func:`detectable_effect` is that effect, in units
of the contrast's standard deviation across seeds, from the noncentral t distribution.
"""

from __future__ import annotations

import numpy as np
from scipy import optimize, stats

__all__ = ["detectable_effect", "t_power"]

ALTERNATIVES = ("two-sided", "greater")


def t_power(effect: float, n: int, alpha: float, alternative: str = "two-sided") -> float:
    """Power of the one-sample t test over ``n`` units for a standardised mean ``effect`` (mean / SD).

    The statistic ``sqrt(n) mean / s`` follows a noncentral t with ``n - 1`` degrees of freedom and
    noncentrality ``sqrt(n) effect``; the power is its mass beyond the critical values of the central t.

    Parameters
    ----------
    effect : float
        True mean of the unit values over their standard deviation.
    n : int
        Independent units (seeds), at least 2.
    alpha : float
        Level of the test, in (0, 1).
    alternative : {"two-sided", "greater"}
        ``"two-sided"`` (as the readings' p-values are): rejection in either tail at ``alpha / 2`` each;
        ``"greater"``: the upper tail at ``alpha``.

    Returns
    -------
    float
        Probability of rejecting the null of a zero mean.
    """
    _check(n, alpha, alternative)
    df, shift = n - 1, float(effect) * np.sqrt(n)
    if alternative == "greater":
        return float(stats.nct.sf(stats.t.ppf(1 - alpha, df), df, shift))
    crit = stats.t.ppf(1 - alpha / 2, df)
    # the lower tail as the upper tail of the mirrored shift: scipy's nct.cdf gives NaN far in that tail
    return float(stats.nct.sf(crit, df, shift) + stats.nct.sf(crit, df, -shift))


def detectable_effect(n: int, alpha: float, power: float = 0.8, alternative: str = "two-sided") -> float:
    """Smallest standardised mean (mean / SD) that the t test over ``n`` units detects with ``power``.

    The root in ``effect >= 0`` of ``t_power(effect, n, alpha) = power`` (the power rises with the effect).
    Multiply by the contrast's standard deviation across seeds to get the smallest detectable mean contrast
    in the metric's units.

    Parameters
    ----------
    n : int
        Independent units (seeds), at least 2.
    alpha : float
        Level of the test: for a reading in a Holm family of ``m``, ``alpha / (m - i)`` at its step ``i``.
    power : float
        Required probability of rejection (0.8), above ``alpha``.
    alternative : {"two-sided", "greater"}
        As in :func:`t_power`.

    Returns
    -------
    float
        The effect in standard deviations of one unit's value.
    """
    _check(n, alpha, alternative)
    if not alpha < power < 1:
        raise ValueError(f"power must lie in (alpha, 1) = ({alpha}, 1), got {power}")
    gap = lambda e: t_power(e, n, alpha, alternative) - power  # noqa: E731
    hi = 1.0
    while gap(hi) < 0:  # two units at a level of 1e-4 need an effect of about 100 SD: double until bracketed
        hi *= 2
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-10))


def _check(n: int, alpha: float, alternative: str) -> None:
    if int(n) != n or n < 2:
        raise ValueError(f"a t test needs at least two units, got n={n}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")

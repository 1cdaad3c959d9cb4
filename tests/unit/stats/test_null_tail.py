"""The parametric tail of chapter 12's readings (qkplast.stats.nulls.null_tail_test): calibrated on planted nulls,
no floor where the rank p has one, the windows' spread and the detectable effect."""

import numpy as np
import pytest
from scipy import stats

from qkplast.stats.nulls import null_tail_test, rank_p, tail_calibration, tail_detectable


def _binomial_band(p, reps, z=4.0):
    half = z * np.sqrt(p * (1 - p) / reps)
    return p - half, p + half


def test_tail_p_is_uniform_under_exchangeable_normal_nulls():
    reps = 20000
    for n_windows in (None, 2):
        cal = tail_calibration(12, n_windows, alphas=(0.05,), reps=reps, seed=1)
        lo, hi = _binomial_band(0.05, reps)
        if n_windows is None:  # exact: the prediction-interval t
            assert lo < cal["tail"][0] < hi and lo < cal["tail_one"][0] < hi
        else:  # the windows' spread added: never liberal
            assert cal["tail"][0] < hi
        assert cal["rank"][0] == 0.0  # below the rank p's floor 1/13 nothing can reject
    # the function the chapter decides with, replicate by replicate: its p uniform on a planted null
    x = np.random.default_rng(4).normal(size=(2000, 13))
    p = np.array([null_tail_test(r[0], r[1:])["p"] for r in x])
    assert 0.0 <= p.min() and p.max() <= 1.0 and stats.kstest(p, "uniform").pvalue > 1e-3


def test_tail_reaches_below_the_rank_floor_and_reads_both_directions():
    null = np.random.default_rng(0).normal(0, 1, 12)
    big = null_tail_test(10.0, null)
    assert big["p_rank"] == pytest.approx(1 / 13) == big["floor"]
    assert big["p"] < 1e-4 and big["p_one"] < big["p"]  # the tail has no floor
    assert big["lo"] < big["estimate"] < big["hi"] and big["estimate"] == pytest.approx(10 - null.mean())
    other = null_tail_test(-10.0, null)
    assert other["p"] == pytest.approx(big["p"], rel=0.3) and other["p_one"] > 0.99  # two-sided p, one-sided p_one
    assert null_tail_test(-10.0, null, alternative="less")["p_one"] < 1e-4
    assert rank_p(-10.0, null, "less") == pytest.approx(1 / 13)


def test_windows_spread_widens_the_test_and_lowers_the_df():
    null = np.random.default_rng(0).normal(0, 1, 12)
    alone = null_tail_test(3.0, null)
    assert alone["df"] == pytest.approx(11)
    both = null_tail_test(3.0, null, window_contrast=[1.0, 5.0, 3.0])
    assert both["se"] > alone["se"] and 2 <= both["df"] < 11 + 2 and both["p"] > alone["p"]
    with pytest.raises(ValueError, match="at least two windows"):
        null_tail_test(3.0, null, window_contrast=[1.0])
    with pytest.raises(ValueError, match="two finite null"):
        null_tail_test(3.0, [1.0])


def test_detectable_effect_is_what_the_tail_detects_with_the_stated_power():
    rng = np.random.default_rng(2)
    d = tail_detectable(1.0, 11, 0.01)
    # planted: targeted set shifted by d, null sets N(0, 1); power of the tail at alpha 0.01 about 0.8 (the noncentral
    # t with df rounded down; the shift scales with sd_null sqrt(1 + 1/n), here se = 1 by construction)
    sd = 1 / np.sqrt(1 + 1 / 12)
    hits = [null_tail_test(d * sd + rng.normal(0, sd), rng.normal(0, sd, 12))["p"] < 0.01 for _ in range(2000)]
    assert 0.74 < np.mean(hits) < 0.86
    assert tail_detectable(1.0, 11, 0.01) > tail_detectable(1.0, 11, 0.05)

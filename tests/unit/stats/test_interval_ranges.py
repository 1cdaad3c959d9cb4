"""Intervals stay inside their quantity's range (issue 37): AP aggregates, masses and shares in [0, 1], AP_drop and
correlations in [-1, 1], on the logit / Fisher-z scale and mapped back; NaN with a reason where the data cannot give
one. Every interval-producing function the book uses is checked on planted inputs near both bounds, and the
bootstrap's lo/hi on planted captures of 4 documents whose plasticity sits near 1 and near its floor."""

import warnings

import numpy as np
import pytest

from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.stats.bootstrap import RANGES, bootstrap, document_interval, metric_bounds
from qkplast.stats.intervals import (NONNEGATIVE, SIGNED_RANGE, UNIT_RANGE, bounded_t_interval, from_unbounded, inside,
                                     jackknife_t, leave_two_out, policy_interval, t_interval, to_unbounded,
                                     unbounded_slope)
from qkplast.theory.planted import planted_capture


def assert_in_range(ci, bounds, centre=None):
    """Finite ends inside ``bounds`` around the centre; NaN ends only with a reason."""
    lo, hi = np.asarray(ci["lo"], float), np.asarray(ci["hi"], float)
    a, b = (np.broadcast_to(np.asarray(e, float), lo.shape) for e in bounds)
    ok = np.isfinite(lo)
    assert (np.isfinite(hi) == ok).all()
    assert (lo[ok] >= a[ok]).all() and (hi[ok] <= b[ok]).all(), (lo, hi)
    c = np.asarray(ci["estimate"] if centre is None else centre, float)
    assert (lo[ok] <= c[ok]).all() and (c[ok] <= hi[ok]).all()
    reason = np.asarray(ci["reason"], object) if "reason" in ci else np.full(lo.shape, "")
    assert all(r.startswith("undefined with") for r in reason[~ok].ravel())
    assert all(r == "" for r in reason[ok].ravel())


def leave_out(x):
    """Leave-one-out and leave-two-out means of ``x [unit, ...]``."""
    n = x.shape[0]
    jack = (x.sum(0) - x) / (n - 1)
    two = np.stack([(x.sum(0) - x[i] - x[j]) / (n - 2) for i, j in leave_two_out(n)])
    return jack, two


def test_transforms_are_logit_and_fisher_z_and_invert():
    x = np.array([0.02, 0.5, 0.97])
    np.testing.assert_allclose(to_unbounded(x, UNIT_RANGE), np.log(x / (1 - x)))
    np.testing.assert_allclose(to_unbounded(2 * x - 1, SIGNED_RANGE), np.arctanh(2 * x - 1))
    for bounds in (UNIT_RANGE, SIGNED_RANGE, (-2.0, 2.0), None):
        v = -0.9 + 1.8 * x if bounds != UNIT_RANGE else x
        np.testing.assert_allclose(from_unbounded(to_unbounded(v, bounds), bounds), v, rtol=1e-12)
        h = 1e-6  # the delta method's slope is the transform's derivative
        np.testing.assert_allclose(unbounded_slope(v, bounds),
                                   (to_unbounded(v + h, bounds) - to_unbounded(v - h, bounds)) / (2 * h), rtol=1e-5)
    assert np.isneginf(to_unbounded(0.0, UNIT_RANGE)) and np.isnan(to_unbounded(1.5, UNIT_RANGE))
    assert list(inside([0.0, 0.3, 1.0], UNIT_RANGE)) == [False, True, False]
    with pytest.raises(ValueError, match="bounds must be"):
        to_unbounded(0.5, (1.0, 0.0))
    with pytest.raises(ValueError, match="a half-line"):
        to_unbounded(0.5, (-np.inf, 0.0))


def test_a_half_line_is_on_the_log_scale():
    x = np.array([0.01, 1.9, 14.0])
    np.testing.assert_allclose(to_unbounded(x, NONNEGATIVE), np.log(x))
    np.testing.assert_allclose(to_unbounded(x + 2.0, (2.0, np.inf)), np.log(x))
    np.testing.assert_allclose(from_unbounded(to_unbounded(x, NONNEGATIVE), NONNEGATIVE), x, rtol=1e-12)
    h = 1e-6
    np.testing.assert_allclose(unbounded_slope(x, NONNEGATIVE),
                               (to_unbounded(x + h, NONNEGATIVE) - to_unbounded(x - h, NONNEGATIVE)) / (2 * h), rtol=1e-5)
    assert np.isneginf(to_unbounded(0.0, NONNEGATIVE)) and np.isnan(to_unbounded(-0.5, NONNEGATIVE))
    assert list(inside([0.0, 0.3, 1e9], NONNEGATIVE)) == [False, True, True]


def test_small_losses_keep_their_interval_above_zero(rng):
    """4 windows of a copy NLL near 0 (a model that copies well, skewed across windows): Student's t goes below 0
    in many draws, the log-scale interval never does, and it covers the mean more often on this world."""
    x = rng.lognormal(np.log(0.08), 0.8, (4, 2000))  # [window, draw]
    plain = t_interval(x)
    assert (plain["lo"] < 0).mean() > 0.2  # the check below can fail
    ci = bounded_t_interval(x, NONNEGATIVE, unit="windows")
    assert_in_range(ci, NONNEGATIVE)
    truth = 0.08 * np.exp(0.8**2 / 2)
    covered, covered_plain = (((c["lo"] <= truth) & (truth <= c["hi"])).mean() for c in (ci, plain))
    assert covered > 0.88 and covered > covered_plain + 0.02, (covered, covered_plain)  # 0.915 against 0.864 at 20000


@pytest.mark.parametrize("bounds,centre", [(UNIT_RANGE, 0.97), (UNIT_RANGE, 0.03), (SIGNED_RANGE, 0.95),
                                           (SIGNED_RANGE, -0.95)])
def test_means_near_a_bound_stay_inside_where_the_plain_interval_leaves(bounds, centre, rng):
    """4 units near a bound: Student's t on the original scale leaves the range in many draws, the transformed
    one never does (t interval and the policy's jackknife interval, whose 4 units need the second level)."""
    a, b = bounds
    spread = 0.04 * (b - a)
    x = np.clip(centre + spread * rng.standard_normal((4, 500)), a + 1e-4, b - 1e-4)  # [unit, draw]
    plain = t_interval(x)
    assert ((plain["lo"] < a) | (plain["hi"] > b)).mean() > 0.2  # the check below can fail
    ci = bounded_t_interval(x, bounds, unit="documents")
    assert_in_range(ci, bounds)
    assert np.isfinite(ci["lo"]).all()
    jack, two = leave_out(x)
    assert_in_range(policy_interval(x.mean(0), jack, two, bounds=bounds), bounds)
    assert_in_range(jackknife_t(x.mean(0), jack, bounds=bounds), bounds)


def test_the_bounded_t_interval_covers_a_mean_near_a_bound(rng):
    """Shares near 1 (Beta(18, 2) unit values, mean 0.9) over 8 units: the delta-method interval on the logit scale
    keeps its coverage (4000 draws; binomial sd 0.0034)."""
    x = rng.beta(18.0, 2.0, (8, 4000))
    ci = bounded_t_interval(x, UNIT_RANGE)
    cover = ((ci["lo"] <= 0.9) & (0.9 <= ci["hi"])).mean()
    assert 0.93 <= cover <= 0.975, cover


def test_undefined_with_too_few_units_or_an_estimate_on_a_bound():
    one = bounded_t_interval([0.4], UNIT_RANGE, unit="documents")
    assert np.isnan(one["lo"]) and one["reason"] == "undefined with 1 effective documents"
    ones = bounded_t_interval([1.0, 1.0, 1.0], UNIT_RANGE, unit="documents")
    assert np.isnan(ones["hi"]) and str(ones["reason"]).startswith("undefined with 3 effective documents: the mean is on")
    x = np.array([[0.2, 0.5], [0.3, 0.6], [0.4, 1.0]])  # the second column's third unit sits on the bound
    jack, two = leave_out(x)  # the leave-two-out values of column 2 include the unit on the bound
    ci = policy_interval(x.mean(0), jack, two, bounds=UNIT_RANGE, unit="pairs")
    assert np.isfinite(ci["lo"][0]) and np.isnan(ci["lo"][1]) and np.isnan(ci["bias"][1])
    assert ci["reason"][1].startswith("undefined with 3 effective pairs")
    # a missing unit (NaN) is left out, as without bounds, and counts among the effective units no more
    two = jackknife_t(np.array(0.5), np.array([np.nan, 0.4, 0.6]), bounds=SIGNED_RANGE)
    assert two["n"] == 2 and np.isfinite(two["lo"])


def test_p_tests_the_null_on_the_scale_of_the_interval(rng):
    x = 0.1 + 0.05 * rng.standard_normal((6, 3))
    jack, two = leave_out(x)
    signed = policy_interval(x.mean(0), jack, two, bounds=SIGNED_RANGE)
    z = policy_interval(np.arctanh(x.mean(0)), np.arctanh(jack), np.arctanh(two))  # zero is zero on Fisher's z
    np.testing.assert_allclose(signed["p"], z["p"])
    np.testing.assert_allclose(np.tanh(z["lo"]), signed["lo"])
    unit = policy_interval(x.mean(0), jack, two, bounds=UNIT_RANGE)  # zero is the bound: the original scale's p
    np.testing.assert_allclose(unit["p"], policy_interval(x.mean(0), jack, two)["p"])
    free = policy_interval(x.mean(0), jack, two, bounds=(np.full(3, -np.inf), np.full(3, np.inf)))
    np.testing.assert_allclose(free["lo"], policy_interval(x.mean(0), jack, two)["lo"])


#: planted captures of 4 documents whose plasticity sits near 1 (no drift, keys off axis) and near its floor
#: (strong drifts, little key noise); the seeds are ones where the unbounded policy interval left [0, 1]
NEAR_BOUNDS = {
    "near one": (dict(beta_pos=0.0, key_slope=0.0, doc_effect=0.6, key_axis=3, world_seed=2), (3, 5)),
    "near the floor": (dict(beta_pos=5e-2, key_slope=5e-2, key_noise=0.1, doc_effect=0.3, world_seed=1), (2, 3)),
}


@pytest.mark.parametrize("world", list(NEAR_BOUNDS))
def test_bootstrap_lo_hi_stay_inside_each_statistics_range(world):
    kw, seeds = NEAR_BOUNDS[world]
    left = 0
    for seed in seeds:
        cap = planted_capture(n_heads=3, dim=8, seq_len=2048, bucket_size=128, n_docs=4, samples_per_bucket=6,
                              seed=seed, **kw)[0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlasticityWarning)
            b = bootstrap(cap, n_boot=20, seed=1, n_pairs=32)
        bounds = metric_bounds(b.metric.values)
        for lo, hi in (("lo", "hi"), ("lo_jackknife_t", "hi_jackknife_t"), ("lo_jackknife_bc", "hi_jackknife_bc"),
                       ("lo_jackknife_bc2", "hi_jackknife_bc2")):
            centre = b.estimate if lo == "lo_jackknife_t" else b.estimate_bc
            assert_in_range({"lo": b[lo].values, "hi": b[hi].values, "estimate": centre.values}, bounds)
        assert_in_range({"lo": b.lo.values, "hi": b.hi.values, "estimate": b.estimate_bc.values,
                         "reason": b.reason.values}, bounds)
        ok = np.isfinite(b.lo.values)
        assert ok[[4, 5]].all()  # bias_strength and key_position_slope have no range: always an interval
        # on these captures the full-sample estimate lies inside the policy's interval as well
        assert ((b.lo <= b.estimate) & (b.estimate <= b.hi)).values[ok].all()
        old = policy_interval(b.estimate.values, b.jackknife.values.T, b.jackknife2.values.T)
        left += int(((old["lo"] < bounds[0]) | (old["hi"] > bounds[1])).sum())
    assert left > 0  # the unbounded interval leaves the range on these captures: the check above can fail


def test_document_interval_stays_inside_its_range():
    """The policy's interval for any statistic of a capture (the AP_drop parts, chapter 13's shares) with bounds."""
    cap = planted_capture(n_heads=3, dim=8, seq_len=2048, bucket_size=128, n_docs=4, samples_per_bucket=6, seed=3,
                          **NEAR_BOUNDS["near one"][0])[0]

    def share(c):  # a [0, 1] quantity near 1: the share of samples outside the first bucket, and its complement
        first = float((c.position.values < 128).mean())
        return [1 - first, first]

    ci = document_interval(cap, share, bounds=UNIT_RANGE)
    assert_in_range(ci, UNIT_RANGE)
    assert ci["interval"] == "jackknife_bc2" and np.isfinite(ci["lo"]).all()


def test_ranges_name_every_bootstrap_statistic():
    from qkplast.analysis.decompose import TERMS
    from qkplast.stats.bootstrap import METRICS

    assert set(METRICS) | set(TERMS) <= set(RANGES)
    lo, hi = metric_bounds()
    assert list(lo[:4]) == [0, 0, 0, -1] and np.isinf(lo[4:]).all() and list(hi[:4]) == [1, 1, 1, 1]

"""The inference policy: the bias-corrected jackknife-t, below 8 units with the corrected estimate's own standard
error (leave-two-out values); the bootstrap's lo/hi are the policy's interval, the others stay beside it; any
statistic gets the policy's interval over documents by the jackknife; the bias correction removes a bias of order
1/n that an interval around the estimate misses."""

import warnings

import numpy as np
import pytest

from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.stats.bootstrap import (bootstrap, document_interval, document_jackknife, document_jackknife2,
                                     metric_bounds)
from qkplast.stats.intervals import (JACKKNIFE_BELOW, corrected_jackknife, interval_policy, jackknife_t, leave_two_out,
                                     policy_interval, t_interval, to_unbounded)
from qkplast.stats.decision import verdict
from qkplast.theory.planted import planted_capture


def test_policy_by_number_of_units():
    assert [interval_policy(n) for n in (2, 3, 4, 7, 8, 16)] == ["jackknife_bc"] + ["jackknife_bc2"] * 3 + ["jackknife_bc"] * 2
    assert JACKKNIFE_BELOW == 8
    with pytest.raises(ValueError, match="leave-two-out"):
        policy_interval(np.zeros(2), np.zeros((4, 2)))  # 4 units: the policy needs the second level
    with pytest.raises(ValueError, match="two independent units"):
        interval_policy(1)


def test_bias_correction_removes_a_one_over_n_bias_that_the_plain_interval_misses(rng):
    """The plug-in variance (ddof 0) of n units is biased by -sigma^2/n: around it, a t interval of 4 units covers
    less than its level; around the jackknife's corrected estimate (the unbiased variance) it covers more."""
    x = rng.normal(0.0, 1.0, size=(4, 20_000))
    est = x.var(0)  # ddof = 0: expectation 3/4
    jack = np.stack([np.delete(x, i, 0).var(0) for i in range(4)])
    plain, corrected = jackknife_t(est, jack), jackknife_t(est, jack, bias_correct=True)
    np.testing.assert_allclose(corrected["estimate"], x.var(0, ddof=1), rtol=1e-12)  # Quenouille: the unbiased one
    np.testing.assert_allclose(corrected["bias"], est - x.var(0, ddof=1), rtol=1e-10)
    cover = lambda r: np.mean((r["lo"] <= 1.0) & (1.0 <= r["hi"]))  # noqa: E731
    assert cover(corrected) > cover(plain) + 0.02


def test_the_second_level_gives_each_subsample_its_own_corrected_estimate(rng):
    """The plug-in variance (ddof 0): the corrected estimate of a sample is its unbiased variance, so the corrected
    leave-one-out values are the unbiased variances of the n - 1 remaining units, computed here directly."""
    x = rng.normal(size=(5, 3))  # [unit, statistic]
    jack = np.stack([np.delete(x, i, 0).var(0) for i in range(5)])
    two = np.stack([np.delete(x, [i, j], 0).var(0) for i, j in leave_two_out(5)])
    assert [tuple(p) for p in leave_two_out(4)] == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    expected = np.stack([np.delete(x, i, 0).var(0, ddof=1) for i in range(5)])
    np.testing.assert_allclose(corrected_jackknife(jack, two), expected, rtol=1e-12)
    ci = jackknife_t(x.var(0), jack, bias_correct=True, jackknife2=two)
    np.testing.assert_allclose(ci["se"], np.sqrt(4 / 5 * ((expected - expected.mean(0)) ** 2).sum(0)), rtol=1e-12)
    np.testing.assert_allclose(ci["estimate"], x.var(0, ddof=1), rtol=1e-12)  # the centre is unchanged
    with pytest.raises(ValueError, match="bias_correct"):
        jackknife_t(x.var(0), jack, jackknife2=two)
    with pytest.raises(ValueError, match="leave-two-out values"):
        corrected_jackknife(jack, two[:3])


def test_the_two_level_interval_of_a_mean_is_students_t(rng):
    """A mean has no bias: its corrected leave-one-out values are the leave-one-out means, so the policy's interval
    at 3-7 units is Student's t, as the one-level one is."""
    x = rng.normal(size=(4, 3))
    jack = (x.sum(0) - x) / 3
    two = np.stack([(x.sum(0) - x[i] - x[j]) / 2 for i, j in leave_two_out(4)])
    ci, t = policy_interval(x.mean(0), jack, two), t_interval(x)
    assert ci["interval"] == "jackknife_bc2"
    for name in ("lo", "hi", "se", "p"):
        np.testing.assert_allclose(ci[name], t[name], rtol=1e-12)


def test_on_a_plasticity_shaped_statistic_the_two_level_interval_reaches_its_level(rng):
    """Planted: 4 units x ~ N(0.3, 1) and the statistic 4 Phi(m) Phi(-m) of their mean m (the plasticity's shape).
    The corrected estimate varies more than the estimate; with the one-level standard error its interval covers
    far less than 95% over 20000 experiments, with its own (two-level) standard error it covers at least 95%."""
    from scipy.stats import norm

    pp = lambda m: 4 * norm.cdf(m) * norm.sf(m)  # noqa: E731
    n = 4
    x = rng.normal(0.3, 1.0, size=(n, 20_000))  # [unit, experiment]
    total = x.sum(0)
    jack = pp((total - x) / (n - 1))
    two = pp(np.stack([(total - x[i] - x[j]) / (n - 2) for i, j in leave_two_out(n)]))
    cover = lambda r: np.mean((r["lo"] <= pp(0.3)) & (pp(0.3) <= r["hi"]))  # noqa: E731
    one_level = cover(jackknife_t(pp(x.mean(0)), jack, bias_correct=True))
    policy = policy_interval(pp(x.mean(0)), jack, two)
    assert policy["interval"] == "jackknife_bc2"
    assert one_level < 0.92 and cover(policy) > 0.95  # binomial sd 0.0015


def test_jackknife_t_of_a_mean_is_students_t(rng):
    x = rng.normal(size=(5, 3))  # [unit, statistic]
    jack = (x.sum(0) - x) / (len(x) - 1)  # the mean with each unit left out
    a, b = jackknife_t(x.mean(0), jack), t_interval(x)
    for name in ("lo", "hi", "se", "p"):
        np.testing.assert_allclose(a[name], b[name], rtol=1e-12)
    one = jackknife_t(np.array(1.0), np.array([np.nan, 2.0]))
    assert np.isnan(one["lo"]) and one["n"] == 1


def test_jackknife_t_covers_a_mean_of_four_units_at_its_level(rng):
    x = rng.normal(1.0, 2.0, size=(4, 20_000))  # 20000 experiments of 4 units each
    jack = (x.sum(0) - x) / 3
    ci = jackknife_t(x.mean(0), jack)
    cover = np.mean((ci["lo"] <= 1.0) & (1.0 <= ci["hi"]))
    assert abs(cover - 0.95) < 0.006  # binomial sd 0.0015


@pytest.fixture(scope="module")
def four_docs():
    return planted_capture(n_heads=3, dim=8, seq_len=2048, bucket_size=128, n_docs=4, samples_per_bucket=6,
                           doc_effect=0.3, world_seed=1, seed=2)[0]


def test_bootstrap_reports_the_policys_interval_in_lo_hi(four_docs):
    b = bootstrap(four_docs, n_boot=200, seed=1, n_pairs=32)
    assert b.attrs["interval"] == "jackknife_bc2" and "bias-corrected" in b.attrs["method"]
    np.testing.assert_array_equal(b.lo, b.lo_jackknife_bc2)
    np.testing.assert_array_equal(b.hi, b.hi_jackknife_bc2)
    for name in ("lo_basic", "hi_basic", "lo_percentile", "lo_bca", "lo_jackknife_t", "lo_jackknife_bc", "se_jackknife",
                 "se_jackknife_bc2", "p_jackknife"):
        assert name in b
    # every jackknife interval comes from the leave-one-document-out values the bootstrap also uses for BCa, the
    # policy's from the leave-two-out values as well
    # (each on its statistic's unbounded scale: logit for the AP aggregates, Fisher's z for ap_drop)
    bounds = metric_bounds()
    ci = jackknife_t(b.estimate.values, b.jackknife.values.T, bounds=bounds)
    np.testing.assert_allclose(b.lo_jackknife_t.values, ci["lo"])
    bc = jackknife_t(b.estimate.values, b.jackknife.values.T, bias_correct=True, bounds=bounds)
    np.testing.assert_allclose(b.estimate_bc.values, bc["estimate"])
    two = policy_interval(b.estimate.values, b.jackknife.values.T, b.jackknife2.values.T, bounds=bounds)
    np.testing.assert_allclose(b.lo.values, two["lo"])
    np.testing.assert_allclose(b.hi.values, two["hi"])
    # on the transformed scale the centre is the middle and the one-level bc interval has the plain one's width
    z = lambda v: to_unbounded(np.asarray(v), bounds)  # noqa: E731
    np.testing.assert_allclose((z(b.lo) + z(b.hi)) / 2, z(bc["estimate"]), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(z(b.hi_jackknife_bc) - z(b.lo_jackknife_bc), z(b.hi_jackknife_t) - z(b.lo_jackknife_t),
                               rtol=1e-9)
    # the statistics without a range keep the plain interval
    free = [list(b.metric.values).index(m) for m in ("bias_strength", "key_position_slope")]
    plain = policy_interval(b.estimate.values, b.jackknife.values.T, b.jackknife2.values.T)
    np.testing.assert_allclose(b.lo.values[free], plain["lo"][free])
    assert (b.reason.values == "").all()
    assert b.sizes["document_pair"] == 6
    # the reweighted leave-two-out values are the statistics of the capture without those two documents
    exact = bootstrap(four_docs, n_boot=2, seed=1, n_pairs=32, method="exact")
    np.testing.assert_allclose(exact.jackknife2.sel(metric="bias_strength"), b.jackknife2.sel(metric="bias_strength"),
                               rtol=1e-8)


def test_document_interval_reanalyses_each_left_out_document(four_docs):
    def n_samples(cap):
        return float(cap.sizes["sample"])

    jack = document_jackknife(four_docs, n_samples)
    per_doc = [int((four_docs.doc.values == d).sum()) for d in np.unique(four_docs.doc.values)]
    np.testing.assert_array_equal(jack, four_docs.sizes["sample"] - np.array(per_doc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        from qkplast.analysis.decompose import model_level_terms

        ci = document_interval(four_docs, lambda c: list(model_level_terms(c, None).values()))
    assert ci["interval"] == "jackknife_bc2" and ci["jackknife"].shape == (4, 5) and ci["jackknife2"].shape == (6, 5)
    pairs = document_jackknife2(four_docs, n_samples)
    np.testing.assert_array_equal(pairs, [four_docs.sizes["sample"] - per_doc[i] - per_doc[j] for i, j in leave_two_out(4)])
    assert (ci["lo"] <= ci["estimate"]).all() and (ci["estimate"] <= ci["hi"]).all()  # around the corrected centre
    one = four_docs.isel(sample=np.flatnonzero(four_docs.doc.values == four_docs.doc.values[0]))
    with pytest.raises(ValueError, match="at least two documents"):
        document_jackknife(one, n_samples)


def test_verdict_differs_claim():
    assert verdict(0.1, 0.05, 0.2, 0.01, claim="differs") == "supported"
    assert verdict(-0.1, -0.2, -0.05, 0.01, claim="differs") == "supported"
    assert verdict(0.1, 0.05, 0.2, 0.2, claim="differs") == "left open"  # the correction decides
    assert verdict(0.0, -0.01, 0.01, 0.5, claim="differs", margin=0.02) == "no effect"

"""The inference policy: the bias-corrected jackknife-t; the bootstrap's lo/hi are the policy's interval, the others
stay beside it; any statistic gets the policy's interval over documents by the jackknife; the bias correction
removes a bias of order 1/n that an interval around the estimate misses."""

import warnings

import numpy as np
import pytest

from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.stats.bootstrap import bootstrap, document_interval, document_jackknife
from qkplast.stats.intervals import JACKKNIFE_BELOW, interval_policy, jackknife_t, t_interval
from qkplast.stats.decision import verdict
from qkplast.theory.planted import planted_capture


def test_policy_by_number_of_units():
    assert [interval_policy(n) for n in (2, 4, 7, 8, 16)] == ["jackknife_bc"] * 5
    assert JACKKNIFE_BELOW == 8
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
    assert b.attrs["interval"] == "jackknife_bc" and "bias-corrected" in b.attrs["method"]
    np.testing.assert_array_equal(b.lo, b.lo_jackknife_bc)
    np.testing.assert_array_equal(b.hi, b.hi_jackknife_bc)
    for name in ("lo_basic", "hi_basic", "lo_percentile", "lo_bca", "lo_jackknife_t", "se_jackknife", "p_jackknife"):
        assert name in b
    # both jackknife intervals come from the leave-one-document-out values the bootstrap also uses for BCa
    ci = jackknife_t(b.estimate.values, b.jackknife.values.T)
    np.testing.assert_allclose(b.lo_jackknife_t.values, ci["lo"])
    bc = jackknife_t(b.estimate.values, b.jackknife.values.T, bias_correct=True)
    np.testing.assert_allclose(b.estimate_bc.values, bc["estimate"])
    np.testing.assert_allclose(b.hi.values - b.lo.values, b.hi_jackknife_t.values - b.lo_jackknife_t.values)  # same width


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
    assert ci["interval"] == "jackknife_bc" and ci["jackknife"].shape == (4, 5)
    assert (ci["lo"] <= ci["estimate"]).all() and (ci["estimate"] <= ci["hi"]).all()  # around the corrected centre
    one = four_docs.isel(sample=np.flatnonzero(four_docs.doc.values == four_docs.doc.values[0]))
    with pytest.raises(ValueError, match="at least two documents"):
        document_jackknife(one, n_samples)


def test_verdict_differs_claim():
    assert verdict(0.1, 0.05, 0.2, 0.01, claim="differs") == "supported"
    assert verdict(-0.1, -0.2, -0.05, 0.01, claim="differs") == "supported"
    assert verdict(0.1, 0.05, 0.2, 0.2, claim="differs") == "left open"  # the correction decides
    assert verdict(0.0, -0.01, 0.01, 0.5, claim="differs", margin=0.02) == "no effect"

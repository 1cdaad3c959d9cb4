"""The inference policy: jackknife-t below 8 units, BCa from there on; the bootstrap's lo/hi are the policy's
interval, the others stay beside it; any statistic gets the policy's interval over documents by the jackknife;
a planted world with document effects is covered at its nominal rate."""

import warnings

import numpy as np
import pytest

from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.stats.bootstrap import bootstrap, document_interval, document_jackknife
from qkplast.stats.intervals import JACKKNIFE_BELOW, interval_policy, jackknife_t, t_interval
from qkplast.stats.verdict import verdict
from qkplast.theory.planted import planted_capture


def test_policy_by_number_of_units():
    assert [interval_policy(n) for n in (2, 4, 7, 8, 16)] == ["jackknife_t"] * 3 + ["bca"] * 2
    assert JACKKNIFE_BELOW == 8
    with pytest.raises(ValueError, match="two independent units"):
        interval_policy(1)


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
    assert b.attrs["interval"] == "jackknife_t" and "jackknife-t" in b.attrs["method"]
    np.testing.assert_array_equal(b.lo, b.lo_jackknife_t)
    np.testing.assert_array_equal(b.hi, b.hi_jackknife_t)
    for name in ("lo_basic", "hi_basic", "lo_percentile", "lo_bca", "se_jackknife", "p_jackknife"):
        assert name in b
    # the jackknife-t comes from the leave-one-document-out values the bootstrap also uses for BCa
    ci = jackknife_t(b.estimate.values, b.jackknife.values.T)
    np.testing.assert_allclose(b.lo.values, ci["lo"])


def test_document_interval_reanalyses_each_left_out_document(four_docs):
    def n_samples(cap):
        return float(cap.sizes["sample"])

    jack = document_jackknife(four_docs, n_samples)
    per_doc = [int((four_docs.doc.values == d).sum()) for d in np.unique(four_docs.doc.values)]
    np.testing.assert_array_equal(jack, four_docs.sizes["sample"] - np.array(per_doc))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        from qkplast.analysis.decompose import model_level_parts

        ci = document_interval(four_docs, lambda c: list(model_level_parts(c, None).values()))
    assert ci["interval"] == "jackknife_t" and ci["jackknife"].shape == (4, 5)
    assert (ci["lo"] <= ci["estimate"]).all() and (ci["estimate"] <= ci["hi"]).all()
    one = four_docs.isel(sample=np.flatnonzero(four_docs.doc.values == four_docs.doc.values[0]))
    with pytest.raises(ValueError, match="at least two documents"):
        document_jackknife(one, n_samples)


def test_verdict_differs_claim():
    assert verdict(0.1, 0.05, 0.2, 0.01, claim="differs") == "supported"
    assert verdict(-0.1, -0.2, -0.05, 0.01, claim="differs") == "supported"
    assert verdict(0.1, 0.05, 0.2, 0.2, claim="differs") == "left open"  # the correction decides
    assert verdict(0.0, -0.01, 0.01, 0.5, claim="differs", margin=0.02) == "no effect"

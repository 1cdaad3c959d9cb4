"""Bootstrap over documents: replicates are proper document resamples; intervals separate a planted decay
from none."""

import numpy as np
from scipy import stats
import pytest

from qkplast.stats.intervals import interval_policy
from qkplast.stats.bootstrap import METRICS, bootstrap, model_level, resample_documents
from qkplast.options import AnalysisOptions
from qkplast.theory.planted import planted_capture


@pytest.fixture(scope="module")
def cap():
    return planted_capture(n_heads=3, dim=8, seq_len=2048, bucket_size=256, n_docs=16, samples_per_bucket=3, seed=2)[0]


def test_resample_keeps_documents_whole_and_copies_distinct(cap, rng):
    rep = resample_documents(cap, rng)
    docs = np.unique(cap.doc.values)
    new = np.unique(rep.doc.values)
    assert len(new) == len(docs)  # as many copies as documents, each with its own id
    for d in new:
        base = d.split("#")[0]
        np.testing.assert_array_equal(np.sort(rep.position.values[rep.doc.values == d]),
                                      np.sort(cap.position.values[cap.doc.values == base]))


def test_intervals_and_estimate(cap):
    b = bootstrap(cap, n_boot=12, seed=1, n_pairs=64)
    assert b.attrs["n_boot"] == 12 and "BCa" in b.attrs["method"] and (b.lo_bca <= b.hi_bca).all()
    assert list(b.metric.values) == list(METRICS) and b.replicates.shape == (len(METRICS), 12)
    full = model_level(cap, AnalysisOptions(n_pairs=64))
    np.testing.assert_allclose(b.estimate.values, [full[m] for m in METRICS])
    assert (b.lo <= b.hi).all() and (b.se > 0).all()
    np.testing.assert_allclose(b.lo_basic + b.hi_basic, 4 * b.estimate - b.lo_percentile - b.hi_percentile, rtol=1e-12)
    # the policy reports the bias-corrected jackknife-t in lo/hi (below 8 documents with the two-level standard
    # error), except for a quantity the coverage table gives the plain jackknife-t from 8 documents on (ap_drop)
    name = interval_policy(b.attrs["n_docs"])
    assert b.attrs["interval"] == name and name in ("jackknife_bc", "jackknife_bc2")
    for metric in METRICS:
        own = interval_policy(b.attrs["n_docs"], metric)
        assert str(b.interval.sel(metric=metric).values) == own
        column = {"jackknife": "jackknife_t"}.get(own, own)
        np.testing.assert_array_equal(b.lo.sel(metric=metric), b[f"lo_{column}"].sel(metric=metric))
        np.testing.assert_array_equal(b.hi.sel(metric=metric), b[f"hi_{column}"].sel(metric=metric))
    assert b.attrs["n_docs"] >= 8 and str(b.interval.sel(metric="ap_drop").values) == "jackknife"
    assert "ap_drop: jackknife-t" in b.attrs["method"]
    again = bootstrap(cap, n_boot=12, seed=1, n_pairs=64)
    np.testing.assert_array_equal(b.replicates, again.replicates)


def test_planted_decay_is_resolved_and_no_drift_is_not():
    strong = planted_capture(n_heads=2, dim=8, seq_len=2048, bucket_size=256, n_docs=16, samples_per_bucket=3,
                             beta_pos=4e-3, key_slope=3e-3, seed=3)[0]
    flat = planted_capture(n_heads=2, dim=8, seq_len=2048, bucket_size=256, n_docs=16, samples_per_bucket=3,
                           beta_pos=1e-9, key_slope=0.0, seed=3)[0]
    s = bootstrap(strong, n_boot=20, seed=0, n_pairs=64).sel(metric="ap_drop")
    f = bootstrap(flat, n_boot=20, seed=0, n_pairs=64).sel(metric="ap_drop")
    assert float(s.lo) > 0.1
    assert float(f.lo) < 0 < float(f.hi)


def test_bad_arguments(cap):
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap(cap, n_boot=1)
    with pytest.raises(ValueError, match="level"):
        bootstrap(cap, n_boot=5, level=1.5)
    one = cap.isel(sample=np.flatnonzero(cap.doc.values == cap.doc.values[0]))
    with pytest.raises(ValueError, match="at least two documents"):
        bootstrap(one, n_boot=5)


def test_reweighting_reproduces_each_materialised_replicate_exactly(cap):
    """With every admissible pair kept, a replicate's key pairs are its documents' pairs, so reweighting the
    per-document sums must give the re-analysed replicate to rounding, replicate by replicate."""
    few = planted_capture(n_heads=2, dim=8, seq_len=1024, bucket_size=256, n_docs=6, samples_per_bucket=2, seed=4)[0]
    opt = dict(n_pairs=128)  # at most 6 docs x C(6, 2) = 90 admissible pairs per bucket: all are kept
    fast = bootstrap(few, n_boot=6, seed=3, method="reweight", **opt)
    slow = bootstrap(few, n_boot=6, seed=3, method="exact", **opt)
    np.testing.assert_allclose(fast.replicates, slow.replicates, rtol=1e-9)
    np.testing.assert_allclose(fast.jackknife, slow.jackknife, rtol=1e-9)
    assert fast.attrs["computation"] == "reweight" and "6 replicates" in fast.attrs["method"]


def test_reweighted_standard_errors_match_per_replicate_reanalysis(cap):
    """Sampled key pairs (redrawn per replicate in the exact method): the spreads agree within Monte Carlo error."""
    fast = bootstrap(cap, n_boot=400, seed=5, method="reweight", n_pairs=64)
    slow = bootstrap(cap, n_boot=80, seed=6, method="exact", n_pairs=64)
    # relative sd of an SE estimate from n replicates is about 1/sqrt(2 n): 0.08 for n = 80; allow 3 of those
    ratio = (fast.se / slow.se).sel(metric=["ap_overall", "ap_first20", "ap_last20", "ap_drop", "bias_strength"])
    assert (abs(ratio - 1) < 0.3).all(), ratio.values


def test_bca_interval_reduces_to_percentile_without_bias_or_skew():
    from qkplast.stats.bootstrap import bca_interval

    rng = np.random.default_rng(0)
    reps = rng.normal(size=(20001, 1))
    jack = np.linspace(-1, 1, 11)[:, None]  # symmetric: acceleration 0
    lo, hi, z0, a = bca_interval(reps, np.array([np.median(reps)]), jack, 0.95)
    assert abs(a[0]) < 1e-12 and abs(z0[0]) < 0.02
    np.testing.assert_allclose([lo[0], hi[0]], np.quantile(reps, [0.025, 0.975]), atol=0.03)
    skewed = np.array([0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3.0])[:, None]  # one influential document
    assert bca_interval(reps, np.array([0.0]), skewed, 0.95)[3][0] < 0


def test_bca_counts_replicates_equal_to_the_estimate_up_to_rounding_as_ties():
    """A discrete bootstrap distribution (few documents) where 9 % of the replicates are the original sample:
    whether rounding puts them just above or just below the estimate must not move z0 or the end points."""
    from qkplast.stats.bootstrap import bca_interval

    rng = np.random.default_rng(1)
    est = 0.5
    others = rng.choice([0.40, 0.45, 0.47, 0.52, 0.55, 0.60], size=(910, 1))
    jack = np.array([[0.48], [0.49], [0.51], [0.53]])
    results = []
    for nudge in (-1e-15, 0.0, 1e-15):  # the identity replicates a rounding error below, at, above the estimate
        reps = np.concatenate([others, np.full((90, 1), est * (1 + nudge))])
        results.append(bca_interval(reps, np.array([est]), jack, 0.95))
    for lo, hi, z0, a in results[1:]:
        np.testing.assert_array_equal(z0, results[0][2])
        np.testing.assert_array_equal([lo, hi], [results[0][0], results[0][1]])
    # ties count half: z0 from (#below + 45) / 1000, not from #below alone or #below + 90
    below = int((others < est).sum())
    assert results[0][2][0] == pytest.approx(stats.norm.ppf((below + 45) / 1000))


def test_reweighting_refuses_what_it_cannot_express(cap):
    from qkplast.stats.reweight import reweighted_statistics, supports

    assert supports(AnalysisOptions()) and not supports(AnalysisOptions(covariance="full"))
    with pytest.raises(ValueError, match="method='exact'"):
        reweighted_statistics(cap, np.ones((1, 16)), AnalysisOptions(covariance="full"))
    with pytest.raises(ValueError, match="one column per document"):
        reweighted_statistics(cap, np.ones((1, 3)))
    b = bootstrap(cap, n_boot=3, covariance="full", n_pairs=16)
    assert b.attrs["computation"] == "exact"


def test_repeated_weight_rows_are_computed_once_and_equal_each_row_alone(cap):
    """Distinct weight rows are computed once and mapped back: repeated rows come out identical, and every row
    equals its value computed by itself (a replicate depends on its own weights only)."""
    from qkplast.stats.reweight import reweighted_statistics

    n_doc = len(np.unique(cap.doc.values))
    rng = np.random.default_rng(5)
    rows = rng.multinomial(n_doc, np.full(n_doc, 1 / n_doc), size=3).astype(float)  # [3, doc]
    weights = rows[[0, 1, 0, 2, 1, 0]]  # [6, doc] with repeats
    both = reweighted_statistics(cap, weights, per_head=True)  # [6, head, statistic]
    np.testing.assert_array_equal(both[0], both[2])
    np.testing.assert_array_equal(both[0], both[5])
    np.testing.assert_array_equal(both[1], both[4])
    alone = np.stack([reweighted_statistics(cap, row[None], per_head=True)[0] for row in weights])
    np.testing.assert_allclose(both, alone, rtol=1e-12, atol=1e-15)
    assert not np.allclose(both[0], both[1], equal_nan=True)  # different rows differ: the mapping is not trivial


def test_a_statistic_with_of_cuts_analyses_every_left_out_capture_in_one_batch_with_the_same_values():
    """document_interval with the batched statistic (ModelLevelTerms: every left-out capture in one call) gives the
    values of the same statistic called on each left-out capture, with its share of the whole capture's pairs."""
    import warnings

    from qkplast.analysis.decompose import ModelLevelTerms, model_level_terms
    from qkplast.analysis.pairs import PlasticityWarning
    from qkplast.stats.bootstrap import document_interval, document_jackknife, document_jackknife2

    world, _ = planted_capture(n_heads=3, dim=8, seq_len=1024, bucket_size=64, n_docs=5, samples_per_bucket=6, seed=2,
                               doc_effect=0.3, content_floor=0.4)
    opt = AnalysisOptions(n_pairs=48)
    stat = ModelLevelTerms(opt)
    calls = []
    one_by_one = lambda c, pairs=None: calls.append(1) or list(model_level_terms(c, opt, pairs=pairs).values())  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        batched = document_interval(world, stat, pairs_of=opt)
        looped = document_interval(world, one_by_one, pairs_of=opt)
        assert len(calls) == 1 + 5 + 10  # the loop: the whole capture, 5 left-out documents, 10 left-out pairs
        for name in ("point", "jackknife", "jackknife2", "lo", "hi"):
            np.testing.assert_allclose(batched[name], looped[name], rtol=1e-12, atol=1e-14, err_msg=name)
        np.testing.assert_allclose(document_jackknife(world, stat, opt), looped["jackknife"], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(document_jackknife2(world, stat, opt), looped["jackknife2"], rtol=1e-12, atol=1e-14)

"""Many cuts of one capture analysed at once (qkplast.analysis.cuts): every cut's values are those of the per-capture
analysis of the cut alone, replicate by replicate, to 1e-12 relative (the order of floating-point sums is all that
differs), with the same key-pair draws; jackknife cuts keep their share of the whole capture's pairs."""

import warnings

import numpy as np
import pytest

from qkplast.analysis.cuts import cut_plan, keeps_of, sample_view, supports
from qkplast.analysis.decompose import (ModelLevelTerms, counterfactual_ap, counterfactual_ap_of_cuts, edge_buckets,
                                        model_level_terms, model_level_terms_of_cuts)
from qkplast.analysis.gqa import cross_profiles, cross_profiles_of_cuts
from qkplast.analysis.pairs import PlasticityWarning, pairs_without, sample_key_pairs
from qkplast.options import AnalysisOptions
from qkplast.tensors import resolve_device
from qkplast.theory.planted import planted_capture

#: relative agreement of a batched value with the per-capture one; values within this absolute distance of 0 (the
#: scale of the profiles and parts is 1) compare absolutely
RTOL, ATOL = 1e-12, 1e-14


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)  # bucket 0 has no earlier keys by design
        return fn(*args, **kw)


@pytest.fixture(scope="module")
def planted():
    """Drifting queries and keys (key drift off the query axis), a content spread that shrinks with position and
    documents that differ: every part of the decomposition is non-zero."""
    cap, _ = planted_capture(n_heads=5, dim=16, seq_len=2048, bucket_size=128, n_docs=5, samples_per_bucket=6, seed=7,
                             beta_pos=2e-3, key_slope=1e-3, key_axis=2, content_floor=0.3, doc_effect=0.3)
    return cap


def jackknife_cuts(cap):
    """The whole capture, each document left out and each pair of documents left out, as boolean masks."""
    docs = np.unique(cap.doc.values)
    out = [np.ones(cap.sizes["sample"], dtype=bool)] + [cap.doc.values != d for d in docs]
    return out + [~np.isin(cap.doc.values, docs[[i, j]]) for i in range(len(docs)) for j in range(i + 1, len(docs))]


def random_cuts(cap, n, seed=0):
    """Cuts of random samples, about 70% of each bucket (a reseeded capture's kind of cut)."""
    rng = np.random.default_rng(seed)
    return [rng.random(cap.sizes["sample"]) < 0.7 for _ in range(n)]


def per_cut_terms(cap, cuts, opt, pairs=None):
    return np.array([list(quiet(model_level_terms, cap.isel(sample=np.flatnonzero(k)), opt,
                                pairs=None if pairs is None else pairs[c]).values()) for c, k in enumerate(cuts)])


def test_jackknife_cuts_with_the_whole_captures_pairs_are_the_per_capture_values(planted):
    opt = AnalysisOptions(n_pairs=64)
    cuts = jackknife_cuts(planted)
    full = sample_key_pairs(planted, opt)
    pairs = [pairs_without(full, k) for k in cuts]
    batched = quiet(model_level_terms_of_cuts, planted, cuts, opt, pairs)  # [cut, quantity]
    assert batched.shape == (len(cuts), 5) and np.isfinite(batched).all()
    assert (np.abs(batched[:, 1:]) > 1e-4).all()  # every part is there: the comparison is not of zeros
    np.testing.assert_allclose(batched, per_cut_terms(planted, cuts, opt, pairs), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("overrides", [{}, {"pair_weight": "prefix"}, {"eligible_keys": "before_query"},
                                       {"query_position": "mean"}, {"edge_rule": "bucket_index", "edge_fraction": 0.3},
                                       {"pair_docs": "any", "n_pairs": 32}, {"min_bucket_samples": 12}])
def test_cuts_drawing_their_own_pairs_are_the_per_capture_values(planted, overrides):
    """Each cut draws its pairs as a capture of its own would (the same seed and generator): the same draws, so
    the same values, under every pair rule, weight and edge rule."""
    opt = AnalysisOptions(n_pairs=overrides.pop("n_pairs", 48), **overrides)
    cuts = random_cuts(planted, 4, seed=len(overrides))
    np.testing.assert_allclose(quiet(model_level_terms_of_cuts, planted, cuts, opt), per_cut_terms(planted, cuts, opt),
                               rtol=RTOL, atol=ATOL)


def test_counterfactual_profiles_of_every_bucket_match(planted):
    opt = AnalysisOptions(n_pairs=48)
    cuts = random_cuts(planted, 3, seed=3)
    batched = quiet(counterfactual_ap_of_cuts, planted, cuts, opt)  # [variant, cut, head, bucket]
    for c, keep in enumerate(cuts):
        ref = quiet(counterfactual_ap, planted.isel(sample=np.flatnonzero(keep)), opt).values
        np.testing.assert_array_equal(np.isnan(batched[:, c]), np.isnan(ref))
        np.testing.assert_allclose(batched[:, c], ref, rtol=RTOL, atol=ATOL)


def test_only_the_edge_buckets_are_evaluated_for_the_parts(planted):
    opt = AnalysisOptions(n_pairs=48)
    edges = edge_buckets(planted, opt)
    n_bucket = 2048 // 128
    assert 0 < len(edges) < n_bucket
    prof = quiet(counterfactual_ap_of_cuts, planted, random_cuts(planted, 2), opt, buckets=edges)
    middle = np.setdiff1d(np.arange(n_bucket), edges)
    assert np.isnan(prof[..., middle]).all() and np.isfinite(prof[..., edges[1:]]).all()


def test_options_the_kernels_do_not_batch_are_analysed_cut_by_cut(planted):
    opt = AnalysisOptions(n_pairs=32, covariance="full")
    assert not supports(opt)
    cuts = random_cuts(planted, 2, seed=5)
    np.testing.assert_allclose(quiet(model_level_terms_of_cuts, planted, cuts, opt), per_cut_terms(planted, cuts, opt),
                               rtol=RTOL, atol=ATOL)


def test_the_plan_holds_each_cuts_own_draw_of_pairs(planted):
    opt = AnalysisOptions(n_pairs=40)
    cuts = random_cuts(planted, 3, seed=9)
    plan = cut_plan(planted, keeps_of(planted, cuts), opt, resolve_device("cpu"))
    for c, keep in enumerate(cuts):
        own = sample_key_pairs(sample_view(planted).isel(sample=np.flatnonzero(keep)), opt)
        np.testing.assert_array_equal(plan.pairs[c].i, own.i)
        np.testing.assert_array_equal(plan.pairs[c].j, own.j)
        n = int(keep.sum())
        assert (plan.samples[c, :n].numpy() == np.flatnonzero(keep)).all()
        assert (plan.samples[c, n:].numpy() == planted.sizes["sample"]).all()  # padding: the zero row
    assert plan.pair_buckets[0] > 0  # bucket 0 has no earlier keys: no pair of it is evaluated


def test_the_statistic_object_is_model_level_terms(planted):
    opt = AnalysisOptions(n_pairs=48)
    stat = ModelLevelTerms(opt, ["ap_drop_content", "ap_drop"])
    ref = quiet(model_level_terms, planted, opt)
    np.testing.assert_allclose(quiet(stat, planted), [ref["ap_drop_content"], ref["ap_drop"]], rtol=RTOL, atol=ATOL)
    assert quiet(stat.of_cuts, planted, random_cuts(planted, 3)).shape == (3, 2)


def test_indices_and_masks_give_the_same_cuts(planted):
    opt = AnalysisOptions(n_pairs=32)
    masks = random_cuts(planted, 2, seed=11)
    np.testing.assert_array_equal(quiet(model_level_terms_of_cuts, planted, masks, opt),
                                  quiet(model_level_terms_of_cuts, planted, [np.flatnonzero(m) for m in masks], opt))


# --------------------------------------------------------------------------- the GQA cross profiles


def grouped(seed=2):
    cap, _ = planted_capture(n_heads=18, dim=8, n_docs=5, samples_per_bucket=6, seed=seed, doc_effect=0.3, world_seed=3)
    k = cap.k.values.copy()
    group = cap.layer.values * 100 + cap.kv_head.values
    for g in np.unique(group):  # the heads of a group share their keys, as in a capture
        idx = np.flatnonzero(group == g)
        k[idx] = k[idx[0]]
    return cap.assign(k=(cap.k.dims, k))


def test_cross_profiles_of_left_out_captures_are_the_per_capture_ones():
    cap = grouped()
    opt = AnalysisOptions(n_pairs=48)
    cuts = jackknife_cuts(cap)[:7]
    batched = quiet(cross_profiles_of_cuts, cap, cuts, opt)  # [cut, head, kv_slot, query_bucket]
    assert batched.dims == ("cut", "head", "kv_slot", "query_bucket")
    for c, keep in enumerate(cuts):
        ref = quiet(cross_profiles, cap.isel(sample=np.flatnonzero(keep)), opt)
        np.testing.assert_array_equal(batched.kv_head_of_slot.values, ref.kv_head_of_slot.values)
        np.testing.assert_array_equal(np.isnan(batched.values[c]), np.isnan(ref.values))
        np.testing.assert_allclose(batched.values[c], ref.values, rtol=RTOL, atol=ATOL)


def test_keys_that_differ_within_a_group_are_each_heads_own():
    """cross_profiles scores a head's own slot against its own keys: heads of one group with different keys (not a
    capture's, a test's) take groups of their own, and the values are still the per-capture ones."""
    cap, _ = planted_capture(n_heads=18, dim=8, n_docs=4, samples_per_bucket=6, seed=4, doc_effect=0.3)
    opt = AnalysisOptions(n_pairs=32)
    cuts = jackknife_cuts(cap)[:3]
    batched = quiet(cross_profiles_of_cuts, cap, cuts, opt)
    for c, keep in enumerate(cuts):
        ref = quiet(cross_profiles, cap.isel(sample=np.flatnonzero(keep)), opt)
        np.testing.assert_allclose(batched.values[c], ref.values, rtol=RTOL, atol=ATOL)


def test_keys_drifting_far_more_than_they_vary_are_scored_from_their_differences():
    """Where the keys' drift makes most of a pair's difference, the variance without the drift cancels in its
    expansion: those pairs are computed from their differences, and every cut still equals the per-capture value."""
    cap, _ = planted_capture(n_heads=3, dim=8, seq_len=2048, bucket_size=128, n_docs=4, samples_per_bucket=6, seed=8,
                             key_slope=5e-3, key_noise=0.02, key_axis=1)
    opt = AnalysisOptions(n_pairs=48)
    cuts = jackknife_cuts(cap)
    np.testing.assert_allclose(quiet(model_level_terms_of_cuts, cap, cuts, opt),
                               per_cut_terms(cap, cuts, opt), rtol=RTOL, atol=ATOL)

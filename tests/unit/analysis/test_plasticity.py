"""Attention plasticity (section 4.4): planted answers, closed form vs Monte Carlo, invariance, bad input.

Which key pairs are drawn and how they are weighted: tests/unit/analysis/test_pairs.py."""

import warnings

import numpy as np
import pytest
import torch
from scipy import stats

from qkplast.options import AnalysisOptions
from qkplast.analysis.pairs import sample_key_pairs
from qkplast.analysis.plasticity import PlasticityWarning, pairwise_plasticity, plasticity
from qkplast.theory.planted import planted_capture, random_orthogonal, true_query_moments


from tests.unit.analysis.conftest import quiet_plasticity as run


def analytic_ap(cap, truth, opt):
    """The exact Gaussian AP of each bucket from the planted parameters, on the same key pairs."""
    pairs = sample_key_pairs(cap, opt)
    mean, cov = true_query_moments(truth, pairs.tau)  # [head, bucket, dim], [head, dim, dim]
    k = cap.k.values
    delta = k[:, pairs.i] - k[:, pairs.j]  # [head, bucket, pair, dim]
    mu = np.einsum("hbpd,hbd->hbp", delta, mean)
    var = np.einsum("hbpd,hde,hbpe->hbp", delta, cov, delta)
    with np.errstate(invalid="ignore", divide="ignore"):  # padded pairs have delta = 0
        pp = 4 * stats.norm.cdf(mu / np.sqrt(var)) * stats.norm.cdf(-mu / np.sqrt(var))
    pp = np.where(pairs.valid[None], pp, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(pp, -1)


@pytest.mark.parametrize("covariance", ["full", "joint"])
def test_closed_form_matches_analytic_value(gaussian, covariance):
    cap, truth = gaussian
    kw = {"covariance": covariance}
    if covariance == "joint":
        kw.update(positional_fit="per_bucket")
    res = run(cap, **kw)
    want = analytic_ap(cap, truth, AnalysisOptions(**kw))
    ok = ~np.isnan(want)
    assert ok[:, 1:].all() and np.isnan(res.ap.values[:, 0]).all()
    # "joint" also estimates coordinate 1 per bucket (and its within-bucket position spread): looser
    np.testing.assert_allclose(res.ap.values[ok], want[ok], atol=0.02 if covariance == "full" else 0.035)
    assert np.abs(res.ap.values[ok] - want[ok]).mean() < 0.006


def test_diagonal_matches_analytic_when_semantic_covariance_is_isotropic():
    cap, truth = planted_capture(n_heads=2, dim=16, n_docs=64, samples_per_bucket=8, diagonal_semantic=True, seed=4)
    res = run(cap)
    want = analytic_ap(cap, truth, AnalysisOptions())
    ok = ~np.isnan(want)
    np.testing.assert_allclose(res.ap.values[ok], want[ok], atol=0.02)


def test_monte_carlo_agrees_with_closed_form_on_gaussian_data(gaussian):
    res = run(gaussian[0], covariance="full")
    diff = (res.ap - res.ap_mc).values[:, 1:]
    assert np.abs(diff).max() < 0.03, diff
    assert np.abs(diff).mean() < 0.01
    np.testing.assert_allclose(res.ap_drop, res.ap_drop_mc, atol=0.02)


def test_monte_carlo_disagrees_on_planted_non_gaussian_case():
    cap, _ = planted_capture(n_heads=2, dim=16, n_docs=64, samples_per_bucket=8, semantic="skewed", seed=3)
    res = run(cap, covariance="full")
    diff = (res.ap - res.ap_mc).values[:, 1:6]
    assert diff.mean() > 0.1, diff  # the Gaussian closed form misses the rare-event tail


def test_plasticity_decays_with_query_position(gaussian):
    res = run(gaussian[0])
    assert (res.ap_drop > 0.3).all()
    assert (res.ap_first20 > res.ap_last20).all()
    np.testing.assert_allclose(res.ap_drop, res.ap_first20 - res.ap_last20)


def test_pairwise_plasticity_is_stable_in_the_tails():
    z = torch.tensor([0.0, 1.0, 8.0, 10.0, 30.0, -30.0], dtype=torch.float64)
    pp = pairwise_plasticity(z, torch.ones_like(z)).numpy()
    assert pp[0] == 1.0
    np.testing.assert_allclose(pp[1:5], 4 * stats.norm.sf(z[1:5].numpy()) * stats.norm.cdf(z[1:5].numpy()), rtol=1e-12)
    assert pp[3] > 1e-23 and pp[4] > 0 and pp[4] == pp[5]
    naive = 4 * stats.norm.cdf(10.0) * (1 - stats.norm.cdf(10.0))
    assert naive == 0.0  # what 4 p (1 - p) would have returned
    assert np.isnan(pairwise_plasticity(torch.tensor([1.0]), torch.tensor([0.0]))).all()


def transform(cap, rng, per_head=True):
    r = random_orthogonal(rng, cap.sizes["head"] if per_head else 1, cap.sizes["dim"])
    r = np.broadcast_to(r, (cap.sizes["head"],) + r.shape[1:])
    rot = lambda x: np.einsum("hij,hsj->hsi", r, x)  # noqa: E731
    return cap.assign(q=(cap.q.dims, rot(cap.q.values)), k=(cap.k.dims, rot(cap.k.values)))


def test_invariant_under_orthogonal_transforms_with_full_covariance(gaussian, rng):
    cap = gaussian[0]
    moved = transform(cap, rng)
    np.testing.assert_allclose(np.einsum("hsd,hsd->hs", moved.q, moved.k), np.einsum("hsd,hsd->hs", cap.q, cap.k),
                               rtol=1e-10, atol=1e-10)
    a, b = run(cap, covariance="full"), run(moved, covariance="full")
    for name in ("ap", "ap_overall", "ap_drop", "ap_map"):
        np.testing.assert_allclose(b[name], a[name], rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(b.ap_mc, a.ap_mc, atol=1e-12)
    np.testing.assert_allclose(b.beta_pos, a.beta_pos, rtol=1e-9)


def test_diagonal_variance_depends_on_the_basis(gaussian, rng):
    """eq. 4.12 takes the diagonal in the Householder basis, whose complement is arbitrary:
    an orthogonal change of coordinates moves the result when Sigma_b is not diagonal."""
    cap = gaussian[0]
    a, b = run(cap), run(transform(cap, rng))
    assert np.nanmax(np.abs(a.ap - b.ap)) > 1e-3


def test_options_change_results_as_documented(gaussian):
    cap = gaussian[0]
    base = run(cap)
    mean_tau = run(cap, query_position="mean")
    assert not np.allclose(base.tau, mean_tau.tau)
    uniform = run(cap, bucket_weight="uniform")
    np.testing.assert_allclose(uniform.ap_overall, np.nanmean(base.ap, -1))
    idx = run(cap, edge_rule="bucket_index")
    assert idx.in_first20.values.sum() == 4 and idx.in_last20.values.sum() == 4
    assert base.in_first20.values.tolist()[:4] == [True, True, True, False]


def test_bucket_without_enough_queries_warns_and_is_nan():
    cap, _ = planted_capture(n_heads=2, dim=8, seq_len=1024, bucket_size=128, n_docs=4, samples_per_bucket=2, seed=0)
    keep = ~((cap.bucket.values == 5) & (cap.doc.values != "doc-000"))
    keep &= ~((cap.bucket.values == 5) & (cap.position.values != cap.position.values[cap.bucket.values == 5].min()))
    thin = cap.isel(sample=np.flatnonzero(keep))
    with pytest.warns(PlasticityWarning) as record:
        res = plasticity(thin)
    assert any("query buckets [5] have fewer than 2 queries" in str(w.message) for w in record)
    assert np.isnan(res.ap.sel(query_bucket=5)).all()
    assert not np.isnan(res.ap.sel(query_bucket=6)).any()


def test_fewer_than_two_keys_warns_naming_bucket():
    cap, _ = planted_capture(n_heads=1, dim=8, seq_len=1024, bucket_size=256, n_docs=3, samples_per_bucket=1, seed=0)
    with pytest.warns(PlasticityWarning, match=r"query buckets \[0, 1\] have fewer than two eligible keys"):
        res = plasticity(cap)
    assert np.isnan(res.ap.values[:, :2]).all() and not np.isnan(res.ap.values[:, 2:]).any()


def test_bad_options_are_errors(gaussian):
    with pytest.raises(TypeError, match="unknown analysis option"):
        plasticity(gaussian[0], n_pair=3)
    with pytest.raises(ValueError, match="covariance"):
        AnalysisOptions(covariance="banded")
    with pytest.raises(ValueError, match="joint"):
        AnalysisOptions(covariance="joint")


def test_pair_statistics_reproduce_ap_and_isolate_the_independence_assumption(gaussian):
    cap, truth = gaussian
    from qkplast.analysis.plasticity import pair_statistics

    ps = pair_statistics(cap, heads=[0, 1], n_pairs=64)
    res = run(cap.isel(head=[0, 1]), n_pairs=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_allclose(np.nanmean(ps.pp.values, -1), res.ap.values, rtol=1e-12)
    assert abs(float(np.nanmedian(ps.v_joint / ps.v_indep)) - 1) < 0.02  # independent by construction
    # plant a dependence: semantic coordinate 2 copies the positional residual
    y = np.einsum("hji,hsj->hsi", truth.rotation, cap.q.values)  # back to the planted basis
    t = cap.position.values
    y[..., 1] += 2.0 * (y[..., 0] - truth.alpha_pos[:, None] - truth.beta_pos[:, None] * t)
    dep = cap.assign(q=(cap.q.dims, np.einsum("hij,hsj->hsi", truth.rotation, y)))
    ps_dep = pair_statistics(dep, heads=[0, 1], n_pairs=64)
    ratio = (ps_dep.v_joint / ps_dep.v_indep).values
    assert np.nanmax(np.abs(ratio - 1)) > 0.3
    np.testing.assert_allclose(ps.gamma * np.sqrt(ps.v_diag), ps.delta1 * ps.beta_pos, rtol=1e-10)


@pytest.mark.parametrize("covariance", ["diagonal", "full", "joint"])
def test_fast_closed_form_matches_the_materialising_reference(gaussian, covariance):
    """pair_closed_form never forms delta; the straightforward eqs. 4.11-4.14 on delta agree to rounding."""
    from qkplast.analysis.pairs import pair_plan
    from qkplast.analysis.plasticity import closed_form, closed_form_kernel, pair_moments

    cap = gaussian[0]
    kw = {"covariance": covariance, "n_pairs": 64}
    if covariance == "joint":
        kw["positional_fit"] = "per_bucket"
    opt = AnalysisOptions(**kw)
    lay = pair_plan(cap, opt, torch.device("cpu"), warn=False)
    q, k = torch.as_tensor(cap.q.values), torch.as_tensor(cap.k.values)
    qr, kr, model, pp = closed_form(q, k, lay.t, lay.onehot, lay.tau, lay.pi, lay.pj, opt)
    delta = kr[:, lay.pi] - kr[:, lay.pj]
    want = closed_form_kernel(delta, model)
    ok = lay.pvalid.expand_as(pp)
    np.testing.assert_allclose(pp[ok].numpy(), want[ok].numpy(), rtol=1e-12, atol=1e-14)
    # a pair of (nearly) identical keys: the cancellation guard recomputes its variance from delta
    kr2 = kr.clone()
    kr2[:, lay.pj[3, 0]] = kr2[:, lay.pi[3, 0]] * (1 + 1e-9)
    mu, var = pair_moments(kr2, lay.pi, lay.pj, model)
    d = kr2[:, lay.pi[3, 0]] - kr2[:, lay.pj[3, 0]]
    exact = torch.einsum("hd,hde,he->h", d, model.cov[:, 3], d) if model.full else (d * d * model.cov[:, 3]).sum(-1)
    np.testing.assert_allclose(var[:, 3, 0].numpy(), exact.numpy(), rtol=1e-9)


def test_pair_kernel_equals_the_two_reference_kernels_with_ties_and_uneven_buckets():
    """analyze()'s fused kernel: closed form to rounding, Monte Carlo signs exactly, ties (identical keys) half."""
    from qkplast.analysis.pairs import pair_plan
    from qkplast.analysis.plasticity import (closed_form_kernel, monte_carlo_kernel, pair_differences, pair_kernel,
                                             query_model, rotate)

    cap, _ = planted_capture(n_heads=3, dim=16, n_docs=8, samples_per_bucket=6, seed=4)
    cap = cap.isel(sample=np.flatnonzero(np.arange(cap.sizes["sample"]) % 7 != 3))  # uneven buckets: padding rows
    opt = AnalysisOptions(n_pairs=64)
    lay = pair_plan(cap, opt, torch.device("cpu"), warn=False)
    assert not bool(lay.qmask.all())
    q, k = torch.as_tensor(cap.q.values, dtype=torch.float64), torch.as_tensor(cap.k.values, dtype=torch.float64)
    _, qr, kr = rotate(q, k, lay.t)
    kr[:, lay.pj[5, 0]] = kr[:, lay.pi[5, 0]]  # one pair of identical keys: every score of it is an exact tie
    model = query_model(qr, lay.t, lay.onehot, lay.tau, opt)
    delta = pair_differences(kr, lay.pi, lay.pj).clone()
    want_pp, want_mc = closed_form_kernel(delta, model).clone(), monte_carlo_kernel(qr, delta, lay.qidx, lay.qmask)
    pp, mc = pair_kernel(qr, kr, lay.pi, lay.pj, model, lay.qidx, lay.qmask)
    ok = lay.pvalid.expand_as(pp) & ~torch.isnan(want_pp)
    np.testing.assert_allclose(pp[ok].numpy(), want_pp[ok].numpy(), rtol=1e-11, atol=1e-15)
    assert torch.equal(torch.isnan(pp), torch.isnan(want_pp))
    assert torch.equal(torch.nan_to_num(mc, nan=-1.0), torch.nan_to_num(want_mc, nan=-1.0))
    n = lay.qmask[5].sum().item()
    np.testing.assert_allclose(mc[:, 5, 0].numpy(), n / (n - 1))  # p = 1/2 exactly: 4 p (1 - p) = 1, unbiased
    # a full covariance (Lemma A.1's quadratic form) through the same blocks: the reference kernel's values
    full = query_model(qr, lay.t, lay.onehot, lay.tau, AnalysisOptions(covariance="full"))
    pp_full, mc_full = pair_kernel(qr, kr, lay.pi, lay.pj, full, lay.qidx, lay.qmask)
    want_full = closed_form_kernel(delta, full)
    ok = lay.pvalid.expand_as(pp_full) & ~torch.isnan(want_full)
    np.testing.assert_allclose(pp_full[ok].numpy(), want_full[ok].numpy(), rtol=1e-10, atol=1e-15)
    assert torch.equal(torch.nan_to_num(mc_full, nan=-1.0), torch.nan_to_num(want_mc, nan=-1.0))


def test_within_document_statistics_remove_document_offsets():
    """Queries with a per-document offset: pooled statistics count it as spread and raise plasticity;
    within-document statistics give back (nearly) the offset-free answer."""
    from qkplast.analysis.pooling import within_document_ap

    cap, _ = planted_capture(n_heads=2, dim=12, n_docs=32, samples_per_bucket=6, seed=9)
    rng = np.random.default_rng(0)
    _, doc = np.unique(cap.doc.values, return_inverse=True)
    offset = rng.normal(0, 1.5, (cap.sizes["head"], doc.max() + 1, cap.sizes["dim"]))
    shifted = cap.assign(q=(cap.q.dims, cap.q.values + offset[:, doc]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base, moved = within_document_ap(cap), within_document_ap(shifted)
        np.testing.assert_allclose(base.ap_pooled, run(cap).ap, rtol=1e-12)
    ok = ~np.isnan(base.ap_pooled.values)
    assert np.abs(base.pooling_excess.values[ok]).mean() < 0.03  # no offsets: pooling changes little
    assert moved.pooling_excess.values[ok].mean() > 0.05  # offsets raise pooled plasticity
    # the offsets also move the pooled bucket means (hence mu), so within is not exactly the offset-free value,
    # but it is far closer to it than the pooled answer is
    near = np.abs(moved.ap_within.values[ok] - base.ap_within.values[ok]).mean()
    assert near < 0.5 * np.abs(moved.ap_pooled.values[ok] - base.ap_pooled.values[ok]).mean()
    assert (moved.within_variance_share.values[:, 1:] < 1).all()
    from qkplast.analysis.pooling import pooling_table

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        table, line = pooling_table(shifted, ("ap_overall", "ap_drop"))
    assert table.loc["ap_overall", "pooled over documents (estimator)"] == pytest.approx(float(moved.ap_overall_pooled.mean()))
    assert table.loc["ap_overall", "difference"] < 0 and "raises" in line  # the offsets: pooling raises plasticity



def test_full_covariance_per_bucket_equals_numpy_on_uneven_buckets():
    """The per-bucket Gram matrices (padded gather) equal numpy's covariance of each bucket's own samples,
    with buckets of different sizes and samples out of bucket order."""
    from qkplast.analysis.plasticity import QueryModel, bucket_members, query_model

    gen = np.random.default_rng(3)
    bucket = gen.permutation(np.repeat([0, 1, 2], [5, 9, 3]))  # [sample]
    onehot = torch.as_tensor(bucket[None] == np.arange(3)[:, None], dtype=torch.float64)  # [bucket, sample]
    members, present = bucket_members(onehot)
    assert members.shape == (3, 9) and present.sum(1).tolist() == [5.0, 9.0, 3.0]
    for b in range(3):
        assert sorted(members[b][present[b] > 0].tolist()) == np.flatnonzero(bucket == b).tolist()
    qr = torch.as_tensor(gen.normal(size=(2, bucket.size, 4)))  # [head, sample, dim]
    t = torch.arange(bucket.size, dtype=torch.float64)
    opt = AnalysisOptions(covariance="full", positional_fit="per_bucket")
    model = query_model(qr, t, onehot, torch.zeros(3, dtype=torch.float64), opt)
    assert isinstance(model, QueryModel) and model.full
    for h in range(2):
        for b in range(3):
            want = np.cov(qr[h, bucket == b].numpy(), rowvar=False)
            want[0, 1:] = want[1:, 0] = 0.0  # coordinate 1 kept independent of the semantic ones (per-bucket fit)
            np.testing.assert_allclose(model.cov[h, b].numpy(), want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("overrides", [{}, {"covariance": "full"}, {"positional_fit": "per_bucket"},
                                       {"pair_weight": "prefix"}])
def test_without_monte_carlo_the_closed_form_is_the_same(gaussian, overrides):
    """``monte_carlo=False`` drops the Monte Carlo variables (most of the work) and changes no other value."""
    cap, _ = gaussian
    both = run(cap, seed=1, **overrides)
    closed = run(cap, seed=1, monte_carlo=False, **overrides)
    assert set(both.data_vars) - set(closed.data_vars) == {
        "ap_mc", "ap_mc_se", "ap_overall_mc", "ap_first20_mc", "ap_last20_mc", "ap_drop_mc", "ap_context_mc",
        "ap_mc_map"}
    for name in closed.variables:
        np.testing.assert_array_equal(closed[name].values, both[name].values)
    assert closed.attrs == both.attrs


def test_pair_statistics_return_the_variances_asked_for(gaussian):
    """A reader of one variance skips the others' quadratic forms; every value returned is the full call's."""
    cap, _ = gaussian
    from qkplast.analysis.plasticity import pair_statistics

    every = pair_statistics(cap, seed=2)
    diagonal = pair_statistics(cap, seed=2, variances=("v_diag",))
    assert {"v_full", "v_indep", "v_joint"} <= set(every) and not {"v_full", "v_indep", "v_joint"} & set(diagonal)
    for name in diagonal.variables:
        np.testing.assert_array_equal(diagonal[name].values, every[name].values)
    # the options' own variance is always there: gamma and z0 rest on it
    full = pair_statistics(cap, seed=2, covariance="full", variances=())
    assert "v_full" in full and "v_diag" not in full
    with pytest.raises(ValueError, match="unknown variances"):
        pair_statistics(cap, seed=2, variances=("v_other",))

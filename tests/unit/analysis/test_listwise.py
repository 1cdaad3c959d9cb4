"""Listwise plasticity ap_set (beyond the thesis): m = 2 is pairwise AP, limits, sets, the model sampler."""

import warnings

import numpy as np
import pytest
import torch
import xarray as xr

from qkplast.stats.permutation_tests import pairwise_predicts_listwise
from qkplast.analysis.listwise import (draw_sets, listwise, model_draws, tied_ranks,
                                       winner_plasticity)
from qkplast.options import AnalysisOptions
from qkplast.analysis.pairs import pair_plan
from qkplast.analysis.plasticity import PlasticityWarning, QueryModel, plasticity
from qkplast.theory.planted import planted_capture


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        return fn(*args, **kw)


@pytest.fixture(scope="module")
def planted():
    return planted_capture(n_heads=3, dim=16, n_docs=16, samples_per_bucket=8, seed=2)[0]


@pytest.mark.parametrize("covariance", ["diagonal", "full"])
def test_m2_is_pairwise_ap(planted, covariance):
    lw = quiet(listwise, planted, set_sizes=(2, 8), covariance=covariance)
    pw = quiet(plasticity, planted, covariance=covariance)
    ok = ~np.isnan(pw.ap.values)
    assert ok.sum() > 20
    assert np.array_equal(np.isnan(lw.ap_set.sel(set_size=2).values), ~ok)
    assert np.abs(lw.ap_set.sel(set_size=2).values[ok] - pw.ap.values[ok]).max() < 1e-12
    assert np.nanmax(np.abs(lw.ap_set_mc.sel(set_size=2).values - pw.ap_mc.values)) < 1e-12


def test_winner_limits_and_pairwise_formula():
    smask = torch.ones(1, 4, dtype=torch.bool)
    fixed = torch.tensor([3.0, 1.0, 0.0, -1.0], dtype=torch.float64).expand(1, 50, 1, 4)  # key 0 always wins
    assert winner_plasticity(fixed, smask)[0, 0] == 0
    rotating = torch.eye(4, dtype=torch.float64).repeat(5, 1)[None, :, None, :]  # each key wins 5 of 20 queries
    assert winner_plasticity(rotating, smask, unbiased=False)[0, 0] == pytest.approx(1.0)
    # m = 2 with p = 0.3 of n = 10 queries: 4 p (1 - p) n / (n - 1); one tie counts one half
    s = torch.tensor([[1.0, 0.0]] * 3 + [[0.0, 1.0]] * 7, dtype=torch.float64)[None, :, None, :]
    assert winner_plasticity(s, torch.ones(1, 2, dtype=torch.bool))[0, 0] == pytest.approx(4 * 0.3 * 0.7 * 10 / 9)
    s[0, 0, 0, 1] = 1.0  # a tie: p = 0.25
    assert winner_plasticity(s, torch.ones(1, 2, dtype=torch.bool))[0, 0] == pytest.approx(4 * 0.25 * 0.75 * 10 / 9)


def test_sets_follow_the_pairwise_rules(planted):
    opt = AnalysisOptions()
    fit = pair_plan(planted, opt, torch.device("cpu"), warn=False)
    bucket, doc = planted.bucket.values, planted.doc.values
    idx, mask = draw_sets(planted, fit, opt, 8, 32, np.random.default_rng(0))
    for qb in (3, 9, 15):
        for s in range(32):
            keys = idx[qb, s][mask[qb, s]]
            assert len(keys) == 8 == len(set(keys))  # distinct keys
            assert (bucket[keys] < qb).all() and len(set(doc[keys])) == 1  # eligible, one document
    whole, wmask = draw_sets(planted, fit, opt, 0, 32, np.random.default_rng(0))
    qb = 5
    for s in range(wmask.shape[1]):
        keys = whole[qb, s][wmask[qb, s]]
        d = doc[keys[0]]
        assert set(keys) == set(np.flatnonzero((bucket < qb) & (doc == d)))  # the document's whole eligible set
    too_big, big_mask = draw_sets(planted, fit, opt, 10_000, 4, np.random.default_rng(0))
    assert not big_mask.any()


def test_impossible_set_size_warns(planted):
    with pytest.warns(PlasticityWarning, match="set size 500"):
        lw = listwise(planted, set_sizes=(2, 500))
    assert np.isnan(lw.ap_set.sel(set_size=500)).all()


def test_model_sampler_matches_model_and_mc_on_gaussian_data(planted):
    mean = torch.tensor([[[1.0, -2.0, 0.5]]], dtype=torch.float64)
    var = torch.tensor([[[0.25, 4.0, 1.0]]], dtype=torch.float64)
    z = torch.randn(200_000, 3, dtype=torch.float64)
    d = model_draws(QueryModel(mean, var, False, *(torch.zeros(1),) * 3), z, 0)
    assert torch.allclose(d.mean(1), mean[:, 0], atol=0.02) and torch.allclose(d.var(1), var[:, 0], rtol=0.02)
    full = torch.tensor([[[[1.0, 0.6], [0.6, 2.0]]]], dtype=torch.float64)
    d = model_draws(QueryModel(torch.zeros(1, 1, 2, dtype=torch.float64), full, True, *(torch.zeros(1),) * 3), z[:, :2], 0)
    assert torch.allclose(torch.cov(d[0].T), full[0, 0], atol=0.03)
    # Gaussian planted queries: the model-draw estimate and the captured-query estimate agree for m = 8
    lw = quiet(listwise, planted, set_sizes=(8,), n_model_queries=512)
    g, e = lw.ap_set.values.ravel(), lw.ap_set_mc.values.ravel()
    ok = ~np.isnan(g)
    assert ok.sum() > 20 and np.abs(g[ok] - e[ok]).mean() < 0.05


def test_nearest_mass(planted):
    lw = quiet(listwise, planted, set_sizes=(2,))
    for name in ("nearest_mass_position", "nearest_mass"):
        v = lw[name].values
        assert np.nanmin(v) >= 0 and np.nanmax(v) <= 1 + 1e-12
        assert np.allclose(v[:, 1], 1.0)  # bucket 1 sees only bucket 0: all mass is on the nearest bucket
    assert np.isnan(lw.nearest_mass.values[:, 0]).all()
    share = lw.nearest_share.values
    assert share[1] == 1.0 and share[4] == pytest.approx(1 / 4)  # equal samples per bucket


def test_set_size_option_checked():
    with pytest.raises(ValueError, match="set_sizes"):
        AnalysisOptions(set_sizes=(2, 1))
    assert AnalysisOptions(set_sizes=[2, 8]).set_sizes == (2, 8)


def test_analyze_returns_the_contract_names(planted):
    import qkplast

    m = quiet(qkplast.analyze, planted, n_pairs=64, set_sizes=(2, 8, 0))
    assert m.ap_set.dims == ("head", "query_bucket", "set_size") and list(m.set_size.values) == [2, 8, 0]
    for name in ("ap_drop_baseline", "ap_drop_bias", "ap_drop_content", "ap_drop_interaction"):
        assert m[name].dims == ("head",)
    total = m.ap_drop_baseline + m.ap_drop_bias + m.ap_drop_content + m.ap_drop_interaction
    assert float(abs(total - m.ap_drop).max()) < 1e-12
    assert float(abs(m.ap_set.sel(set_size=2) - m.ap).max()) < 1e-12


def test_rank_correlation_treats_values_equal_to_rounding_as_ties(rng):
    """Heads often share a listwise value (a few dozen draws give discrete values) and their bucket means then
    differ by rounding alone: the ranks, and so rho and its permutation p-value, must not depend on that."""
    from scipy.stats import rankdata

    x = rng.integers(0, 6, 40) / 7.0  # many exact ties
    noisy = x * (1 + rng.choice([-1, 0, 1], 40) * 2.0**-52)  # the same values, summed in another order
    want = rankdata(x) - 1  # average ranks of the ties
    np.testing.assert_array_equal(tied_ranks(x[None])[0], want)
    np.testing.assert_array_equal(tied_ranks(noisy[None])[0], want)
    np.testing.assert_array_equal(tied_ranks(np.array([[0.1, 0.2, 0.3]]))[0], [0, 1, 2])  # distinct values keep order
    y = x + rng.normal(size=40)
    m = xr.Dataset(
        {"ap_set": (("head", "query_bucket", "set_size"), np.stack([y, x], -1)[:, None, :])},
        coords={"set_size": [2, 8]})
    m_noisy = m.copy(deep=True)
    m_noisy["ap_set"].values[:, 0, 1] = noisy
    a, b = (pairwise_predicts_listwise(d, 8, n_perm=500) for d in (m, m_noisy))
    assert a == b

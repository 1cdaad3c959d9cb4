"""GQA group similarity (beyond the thesis): planted groups are found, unrelated labels are not."""

import numpy as np
import pytest
import torch
import xarray as xr

from qkplast.analysis.gqa import profile_distances
from qkplast.stats.permutation_tests import gqa_similarity, within_layer_permutations


def metrics_with_profiles(rng, grouped: bool, n_layers=6, n_q=9, n_kv=3, n_bucket=12):
    layer = np.repeat(np.arange(n_layers), n_q)
    q_head = np.tile(np.arange(n_q), n_layers)
    kv = q_head // (n_q // n_kv)
    base = rng.normal(0, 0.1, (n_layers, n_kv, n_bucket))  # one profile shape per group
    ap = 0.5 + (base[layer, kv] if grouped else base[layer, rng.integers(0, n_kv, len(layer))] * 0)
    ap = ap + rng.normal(0, 0.1 if not grouped else 0.03, ap.shape)
    ap[:, 0] = np.nan  # bucket 0 has no pairs, as in real metrics
    return xr.Dataset({"ap": (("head", "query_bucket"), ap)},
                      coords={"layer": ("head", layer), "kv_head": ("head", kv), "q_head": ("head", q_head)})


def test_planted_groups_are_detected(rng):
    res = gqa_similarity(metrics_with_profiles(rng, grouped=True), n_perm=1000)
    assert res.statistic < 0 and res.within < res.between
    assert res.p_value < 0.01


def test_no_grouping_gives_a_uniform_p_value(rng):
    ps = [float(gqa_similarity(metrics_with_profiles(np.random.default_rng(s), grouped=False), n_perm=200, seed=s).p_value)
          for s in range(20)]
    assert 0.2 < np.mean(ps) < 0.8  # under the null p is uniform, mean 1/2
    assert np.mean(np.array(ps) < 0.05) <= 0.2


def test_permutations_stay_within_layers(rng):
    layer = np.repeat(np.arange(4), 9)[rng.permutation(36)]
    perms = within_layer_permutations(layer, 50, rng)
    assert (layer[perms] == layer[None]).all()
    assert all(sorted(p) == list(range(36)) for p in perms)
    assert len({tuple(p) for p in perms}) > 40


def test_distances():
    p = torch.tensor([[np.nan, 0.0, 1.0], [np.nan, 0.0, 0.0], [np.nan, np.nan, np.nan]], dtype=torch.float64)
    d = profile_distances(p)
    assert d[0, 1] == pytest.approx(np.sqrt(0.5)) and d[0, 0] == 0 and torch.isnan(d[0, 2])


def test_one_group_is_an_error(rng):
    m = metrics_with_profiles(rng, grouped=True)
    with pytest.raises(ValueError, match="capture more heads"):
        gqa_similarity(m.assign_coords(kv_head=("head", np.zeros(m.sizes["head"], int))))


def test_testable_needs_both_kinds_of_pairs(rng):
    from qkplast.analysis.gqa import gqa_testable

    m = metrics_with_profiles(rng, grouped=True)
    assert gqa_testable(m)
    one_per_group = m.isel(head=np.flatnonzero(m.q_head.values % 3 == 0))  # heads 0, 3, 6: three groups, one head each
    assert not gqa_testable(one_per_group)
    with pytest.raises(ValueError, match="capture more heads"):
        gqa_similarity(one_per_group)


def test_within_minus_between_is_the_direct_mean_over_same_layer_pairs(rng):
    """The product form of the within- and between-group sums gives the means over same-layer pairs of distinct
    heads with a distance (NaN distances left out), for every label set at once."""
    from qkplast.analysis.gqa import within_minus_between

    m = metrics_with_profiles(rng, grouped=True)
    dist = profile_distances(torch.as_tensor(m.ap.values))
    dist[3, 5] = dist[5, 3] = float("nan")  # a pair without a distance
    layer = torch.as_tensor(m.layer.values)
    labels = torch.as_tensor(m.kv_head.values)[torch.as_tensor(within_layer_permutations(m.layer.values, 20, rng))]
    t, within, between = within_minus_between(dist, labels, layer)
    d, ly = dist.numpy(), m.layer.values
    for p, lab in enumerate(labels.numpy()):
        ok = (ly[:, None] == ly[None]) & ~np.eye(len(ly), dtype=bool) & ~np.isnan(d)
        same = lab[:, None] == lab[None]
        w, b = d[ok & same].mean(), d[ok & ~same].mean()
        assert within[p] == pytest.approx(w, rel=1e-12) and between[p] == pytest.approx(b, rel=1e-12)
        assert t[p] == pytest.approx(w - b, rel=1e-10, abs=1e-15)

"""GQA coordination against a null that keeps the keys: shared keys alone make a group's profiles alike, which a
permutation of the group labels counts as coordination and the key-keeping null does not."""

import warnings

import numpy as np
import pytest
import xarray as xr

from qkplast.analysis.gqa import cross_profiles
from qkplast.stats.permutation_tests import gqa_key_null, gqa_similarity
from qkplast.analysis.metrics import analyze
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.theory.planted import planted_capture


def grouped_capture(coordinated: bool, seed: int = 0) -> xr.Dataset:
    """Two layers of 9 query heads in 3 GQA groups. Keys are shared in a group and drift at a rate that differs
    by group; queries are drawn alike for every head of a layer, unless ``coordinated``: then each group's
    queries share a mean of their own as well."""
    base, _ = planted_capture(n_heads=18, dim=8, seq_len=4096, bucket_size=256, n_docs=8, samples_per_bucket=4, seed=seed)
    rng = np.random.default_rng(seed)
    t = base.position.values.astype(float)
    n, d = len(t), 8
    q = np.empty((18, n, d))
    k = np.empty((18, n, d))
    for layer in range(2):
        shared_mu = rng.normal(0, 0.5, d)
        group_keys = {}
        for g, rate in enumerate((0.0, 1e-3, 3e-3)):
            kk = rng.normal(0, 0.5, (n, d))
            kk[:, 0] += rate * t
            group_keys[g] = kk
        for h in range(9):
            g = h // 3
            qq = shared_mu + rng.normal(0, 1.0, (n, d))
            qq[:, 0] += 0.5 + 1e-3 * t
            if coordinated:
                qq[:, 1] += 3.0 * (g - 1)  # the group's own query mean
            q[9 * layer + h], k[9 * layer + h] = qq, group_keys[g]
    return base.assign(q=(("head", "sample", "dim"), q), k=(("head", "sample", "dim"), k))


def test_cross_profiles_hold_each_heads_own_profile():
    cap = grouped_capture(False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        m = analyze(cap, open_questions=False)
        cross = cross_profiles(cap)
    assert cross.dims == ("head", "kv_slot", "query_bucket") and cross.sizes["kv_slot"] == 3
    own = np.stack([cross.values[h, int(np.flatnonzero(cross.kv_head_of_slot.values[h] == m.kv_head.values[h])[0])]
                    for h in range(m.sizes["head"])])
    np.testing.assert_allclose(own, m.ap.values, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("coordinated", [False, True])
def test_shared_keys_alone_are_not_coordination(coordinated):
    cap = grouped_capture(coordinated)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        m = analyze(cap, open_questions=False)
        keys = gqa_key_null(m, cross_profiles(cap), n_perm=400, seed=1)
    labels = gqa_similarity(m, "ap", n_perm=400, seed=1)
    assert float(keys.statistic) == pytest.approx(float(labels.statistic), abs=1e-9)  # one statistic, two nulls
    assert float(labels.p_value) < 0.01  # the label null calls both worlds coordinated
    if coordinated:
        assert float(keys.p_value) < 0.01
    else:
        assert float(keys.p_value) > 0.05  # with queries exchangeable, the shared keys explain the likeness

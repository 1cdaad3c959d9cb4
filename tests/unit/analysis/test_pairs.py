"""Query buckets and key pairs (section 4.4): which pairs are drawn, how they are weighted, and a subset's share."""

import warnings

import numpy as np
import pytest
import torch

from qkplast.analysis.pairs import pair_plan, pair_weights, pairs_without, sample_key_pairs
from qkplast.analysis.plasticity import closed_form
from qkplast.options import AnalysisOptions
from qkplast.theory.planted import planted_capture


from tests.unit.analysis.conftest import quiet_plasticity as run


def test_key_pairs_are_same_document_earlier_buckets_and_shared(gaussian):
    cap = gaussian[0]
    opt = AnalysisOptions(n_pairs=64)
    pairs = sample_key_pairs(cap, opt)
    doc, bucket = cap.doc.values, cap.bucket.values
    for qb in range(1, len(pairs.tau)):
        i, j = pairs.i[qb][pairs.valid[qb]], pairs.j[qb][pairs.valid[qb]]
        assert len(i) == 64 and (doc[i] == doc[j]).all() and (i != j).all()
        assert (bucket[i] < qb).all() and (bucket[j] < qb).all()
    again = sample_key_pairs(cap, opt)
    np.testing.assert_array_equal(pairs.i, again.i)
    anyd = sample_key_pairs(cap, AnalysisOptions(n_pairs=64, pair_docs="any", eligible_keys="before_query"))
    assert anyd.valid[0].all()  # keys below the midpoint of bucket 0 exist
    assert (doc[anyd.i[5]] != doc[anyd.j[5]]).any()


def test_all_pairs_used_when_few():
    cap, _ = planted_capture(n_heads=1, dim=8, seq_len=1024, bucket_size=256, n_docs=2, samples_per_bucket=2, seed=0)
    pairs = sample_key_pairs(cap, AnalysisOptions(n_pairs=256))
    # bucket 3: 3 earlier buckets x 2 samples = 6 keys per doc -> 15 pairs per doc, 30 in all
    assert pairs.n_admissible[3] == 30 and pairs.valid[3].sum() == 30
    got = {tuple(sorted(p)) for p in zip(pairs.i[3][:30], pairs.j[3][:30])}
    assert len(got) == 30


def test_prefix_pair_weights_follow_definition_4_3(gaussian):
    cap = gaussian[0]
    pairs = sample_key_pairs(cap, AnalysisOptions(n_pairs=64))
    w = pair_weights(pairs, cap.position.values, "prefix")
    pos = cap.position.values
    b, p = 6, 5
    j = max(pos[pairs.i[b, p]], pos[pairs.j[b, p]]) + 1
    assert w[b, p] == pytest.approx(1 / (j - 1) - 1 / pairs.tau[b])
    assert (w[~pairs.valid] == 0).all() and (w[pairs.valid] > 0).all()
    uni, pre = run(cap, n_pairs=64), run(cap, n_pairs=64, pair_weight="prefix")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt = AnalysisOptions(n_pairs=64)
        lay = pair_plan(cap, opt, torch.device("cpu"), warn=False)
        pp = closed_form(torch.as_tensor(cap.q.values), torch.as_tensor(cap.k.values), lay.t, lay.onehot, lay.tau,
                         lay.pi, lay.pj, opt)[3].numpy()
    want = np.nansum(pp[:, b] * w[b], -1) / w[b].sum()
    np.testing.assert_allclose(pre.ap.values[:, b], want, rtol=1e-12)
    assert not np.allclose(pre.ap.values[:, 2:], uni.ap.values[:, 2:])
    assert (pre.ap_mc_se.values[:, 1:] > 0).all() and (uni.ap_mc_se.values[:, 1:] < 0.05).all()


def test_pairs_without_keeps_the_kept_samples_pairs_reindexed(gaussian):
    """A left-out document's pairs become padding; the others keep their order, indexed into the kept samples."""
    cap = gaussian[0]
    pairs = sample_key_pairs(cap, AnalysisOptions(n_pairs=64))
    doc = cap.doc.values
    keep = doc != doc[pairs.i[6, 0]]  # drop the document of bucket 6's first pair
    sub = pairs_without(pairs, keep)
    kept = np.flatnonzero(keep)
    lost = pairs.valid & ~(keep[pairs.i] & keep[pairs.j])
    assert lost[6, 0] and not sub.valid[6, 0]
    np.testing.assert_array_equal(sub.valid, pairs.valid & ~lost)
    np.testing.assert_array_equal(kept[sub.i[sub.valid]], pairs.i[sub.valid])
    np.testing.assert_array_equal(kept[sub.j[sub.valid]], pairs.j[sub.valid])
    np.testing.assert_array_equal(sub.tau, pairs.tau)
    assert (sub.i[~sub.valid] == 0).all() and (sub.j[~sub.valid] == 0).all()

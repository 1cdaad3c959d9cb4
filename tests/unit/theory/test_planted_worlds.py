"""Planted worlds beyond appendix A.1: document effects, a fixed world, key drift off the query axis, content that
changes with position; the defaults draw what earlier versions drew."""

import numpy as np
import pytest

from qkplast.theory.planted import planted_capture


def _doc_means(cap, head=0):
    docs = np.unique(cap.doc.values)
    return np.stack([cap.q.values[head, cap.doc.values == d].mean(0) for d in docs])  # [doc, dim]


def test_document_effects_make_documents_differ():
    kw = dict(n_heads=2, dim=8, seq_len=1024, bucket_size=64, n_docs=24, samples_per_bucket=4, seed=3, world_seed=1)
    flat, _ = planted_capture(**kw)
    varied, _ = planted_capture(**kw, doc_effect=0.6)
    # the spread of per-document query means is sampling noise without effects, far more with them
    assert _doc_means(varied).std(0).mean() > 2 * _doc_means(flat).std(0).mean()


def test_a_world_seed_fixes_the_heads_and_a_seed_the_sample():
    a, ta = planted_capture(n_heads=3, dim=8, n_docs=4, seed=1, world_seed=9)
    b, tb = planted_capture(n_heads=3, dim=8, n_docs=4, seed=2, world_seed=9)
    np.testing.assert_array_equal(ta.rotation, tb.rotation)
    np.testing.assert_array_equal(ta.mu_sem, tb.mu_sem)
    assert not np.array_equal(a.q.values, b.q.values)
    c, tc = planted_capture(n_heads=3, dim=8, n_docs=4, seed=1)  # no world seed: one generator for both
    assert not np.array_equal(tc.rotation, ta.rotation)


def test_defaults_are_unchanged_by_the_new_options():
    a, _ = planted_capture(n_heads=2, dim=8, n_docs=3, seed=5)
    b, _ = planted_capture(n_heads=2, dim=8, n_docs=3, seed=5, key_axis=0, content_floor=None, doc_effect=0.0)
    np.testing.assert_array_equal(a.q.values, b.q.values)
    np.testing.assert_array_equal(a.k.values, b.k.values)


def test_key_drift_off_the_query_axis_and_shrinking_content():
    cap, truth = planted_capture(n_heads=2, dim=8, n_docs=16, samples_per_bucket=8, seed=4, key_axis=3,
                                 key_slope=2e-3, content_floor=0.1)
    t = cap.position.values.astype(float)
    planted_k = np.einsum("hji,hsj->hsi", truth.rotation, cap.k.values)  # back to the planted basis
    planted_q = np.einsum("hji,hsj->hsi", truth.rotation, cap.q.values)
    slope = lambda y: np.polyfit(t, y, 1)[0]  # noqa: E731
    assert slope(planted_k[0, :, 3]) == pytest.approx(2e-3, rel=0.1)  # drift on planted coordinate index key_axis
    assert abs(slope(planted_k[0, :, 0])) < 2e-4  # not on the query's drift axis
    early, late = t < 1000, t > 3000
    assert planted_q[0, late, 1:].std(0).mean() < 0.5 * planted_q[0, early, 1:].std(0).mean()
    with pytest.raises(ValueError, match="key_axis"):
        planted_capture(dim=8, key_axis=8)

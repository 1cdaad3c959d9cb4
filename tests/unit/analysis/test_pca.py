"""PCA (section 4.2): planted position structure, sign canonicalisation, taxonomy."""

import numpy as np
import pytest

from qkplast.analysis.pca import classify, pca
from qkplast.theory.planted import planted_capture


@pytest.fixture(scope="module")
def cap():
    return planted_capture(n_heads=4, dim=16, n_docs=32, samples_per_bucket=4, seed=5)[0]


def test_explained_variance_sorted_and_normalised(cap):
    p = pca(cap)
    evr = p.explained_variance_ratio.values
    np.testing.assert_allclose(evr.sum(1), 1.0, atol=1e-12)
    assert (np.diff(evr, axis=1) <= 1e-15).all()


def test_correlations_match_direct_projection(cap):
    p = pca(cap, keep_components=True)
    h = 2
    v = p.components.values[h]  # [pc, dim]
    t = cap.position.values
    for name, x in (("r_q_pc", cap.q.values[h]), ("r_k_pc", cap.k.values[h])):
        proj = x @ v.T  # [sample, pc]
        direct = [np.corrcoef(proj[:, j], t)[0, 1] for j in range(v.shape[0])]
        np.testing.assert_allclose(p[name].values[h], direct, atol=1e-10)


def test_planted_drift_is_pc0_and_position_dominated(cap):
    p = pca(cap)
    assert (p.r_q_pc[:, 0] > 0.7).all() and (p.r_k_pc[:, 0] > 0.7).all()
    assert set(p.taxonomy.values) == {"position-dominated"}


def test_sign_canonicalisation_dominant_positive_and_stable_under_negation(cap):
    p = pca(cap)
    dom = np.where(np.abs(p.r_q_pc) >= np.abs(p.r_k_pc), p.r_q_pc, p.r_k_pc)
    assert (dom >= 0).all()
    flipped = pca(cap.assign(q=-cap.q, k=-cap.k))
    np.testing.assert_allclose(flipped.r_q_pc[:, :4], p.r_q_pc[:, :4], atol=1e-9)
    np.testing.assert_allclose(flipped.r_k_pc[:, :4], p.r_k_pc[:, :4], atol=1e-9)


def test_components_without_variance_have_no_correlation_and_the_sign_rule_holds_elsewhere():
    """Fewer samples than dimensions (a short GPU check at one sample per bucket): the cloud's null space has no
    variance, so its components get NaN correlations, and every component with a correlation follows the sign
    rule, whichever side is NaN."""
    cap = planted_capture(n_heads=3, dim=32, n_docs=1, seq_len=256, bucket_size=32, samples_per_bucket=1, seed=4)[0]
    assert 2 * cap.sizes["sample"] < cap.sizes["dim"]  # the pooled cloud cannot span the space
    p = pca(cap)
    r_q, r_k = p.r_q_pc.values, p.r_k_pc.values
    null = p.explained_variance_ratio.values < 1e-12
    assert null.any() and np.isnan(r_q[null]).all() and np.isnan(r_k[null]).all()
    aq, ak = np.nan_to_num(np.abs(r_q), nan=-1.0), np.nan_to_num(np.abs(r_k), nan=-1.0)
    dom = np.where(aq >= ak, r_q, r_k)
    assert (dom[np.isfinite(dom)] >= 0).all() and np.isfinite(dom[~null]).all()


def test_content_head_without_drift(rng):
    cap = planted_capture(n_heads=2, dim=8, n_docs=16, beta_pos=0.0, key_slope=0.0, seed=2)[0]
    p = pca(cap)
    assert (np.abs(p.r_q_pc[:, 0]) < 0.3).all() and (np.abs(p.r_k_pc[:, 0]) < 0.3).all()
    assert set(p.taxonomy.values) == {"content-focused"}


def test_classify_thresholds():
    rq = np.array([0.9, 0.9, 0.1, 0.5, 0.2, -0.95, 0.71])
    rk = np.array([0.8, 0.5, 0.2, 0.9, 0.29, -0.75, 0.7])
    assert classify(rq, rk).tolist() == [
        "position-dominated", "q-positional", "content-focused", "mixed", "content-focused", "position-dominated",
        "q-positional",
    ]
    assert classify(rq, rk, low=0.1, high=0.95).tolist()[0] == "mixed"

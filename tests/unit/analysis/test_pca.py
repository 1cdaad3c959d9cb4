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

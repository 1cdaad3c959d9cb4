"""Planar rotation (section 4.3): recovers the planted drift axis and slopes; axis a holds all
linear position covariance."""

import numpy as np
import pytest

from qkplast.analysis.rotation import rotation
from qkplast.theory.planted import planted_capture


@pytest.fixture(scope="module")
def planted():
    return planted_capture(n_heads=4, dim=16, n_docs=64, samples_per_bucket=8, key_slope=[1e-3, 1.5e-3, -1e-3, 3e-3],
                           beta_pos=[2e-3, 1e-3, 2e-3, 1e-3], seed=11)


def test_recovers_axis_and_slopes(planted):
    cap, truth = planted
    r = rotation(cap)
    pooled = (truth.beta_pos + truth.key_slope)
    sign = np.sign(pooled)  # a points where the pooled cloud moves with position
    cos = (r.axis_a.values * truth.axis_a).sum(1) * sign
    assert (cos > 0.999).all()
    np.testing.assert_allclose(r.alpha_k.values, truth.key_slope * sign, rtol=0.03)
    np.testing.assert_allclose(r.alpha_q.values, truth.beta_pos * sign, rtol=0.03)
    t_mean = cap.position.values.mean()
    np.testing.assert_allclose(r.mu_q_a.values, sign * (truth.alpha_pos + truth.beta_pos * t_mean), rtol=0.03, atol=0.02)
    np.testing.assert_allclose(r.bias_strength.values, r.mu_q_a.values * r.alpha_k.values, rtol=1e-12)


def test_axis_b_is_planted_separation(planted):
    cap, truth = planted
    r = rotation(cap)
    planted_b = np.einsum("hij,hj->hi", truth.rotation[:, :, 1:], truth.mu_sem - truth.mu_key)
    planted_b /= np.linalg.norm(planted_b, axis=1, keepdims=True)
    assert ((r.axis_b.values * planted_b).sum(1) > 0.99).all()
    np.testing.assert_allclose((r.axis_a.values * r.axis_b.values).sum(1), 0, atol=1e-12)
    assert (r.separation_strength > 0).all()


def test_every_direction_orthogonal_to_a_has_zero_position_covariance(planted, rng):
    cap, _ = planted
    r = rotation(cap)
    rel = r.orthogonal_position_cov.values / r.position_cov_a.values
    assert (rel < 1e-12).all(), rel
    # independent check with random unit directions projected off a, computed with numpy
    x = np.concatenate([cap.q.values, cap.k.values], 1)
    tt = np.concatenate([cap.position.values] * 2).astype(float)
    for h in range(cap.sizes["head"]):
        a = r.axis_a.values[h]
        u = rng.normal(size=(50, a.size))
        u -= np.outer(u @ a, a)
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        proj = x[h] @ u.T
        cov = ((proj - proj.mean(0)) * (tt - tt.mean())[:, None]).sum(0) / (len(tt) - 1)
        assert np.abs(cov).max() < 1e-10 * r.position_cov_a.values[h]


def test_plane_variance_fraction_bounds(planted):
    r = rotation(planted[0])
    assert ((r.plane_variance_fraction > 0) & (r.plane_variance_fraction <= 1)).all()
    assert (np.abs(r.r_k_a) <= 1).all() and (np.abs(r.r_q_a) <= 1).all()


def test_key_position_slope_is_the_slope_of_the_mean_score(planted):
    """mu_Q^T beta_K is the least-squares slope of mean_q(q)^T k over key position, and it splits into
    bias_strength plus the part of the key drift off axis a."""
    import numpy as np

    from qkplast.analysis.rotation import rotation

    cap = planted[0] if isinstance(planted, tuple) else planted
    r = rotation(cap, device="cpu")
    t = cap.position.values.astype(float)
    score = np.einsum("hd,hsd->hs", cap.q.values.mean(1), cap.k.values)
    want = np.array([np.polyfit(t, s, 1)[0] for s in score])
    np.testing.assert_allclose(r.key_position_slope.values, want, rtol=1e-9)
    a = r.axis_a.values
    beta_k = np.array([np.polyfit(t, cap.k.values[h], 1)[0] for h in range(cap.sizes["head"])])
    off = beta_k - np.einsum("hd,hd->h", beta_k, a)[:, None] * a
    mu_q = cap.q.values.mean(1)
    np.testing.assert_allclose(r.key_position_slope.values, r.bias_strength.values + np.einsum("hd,hd->h", mu_q, off),
                               rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(r.key_position_ratio.values, r.key_position_slope.values / r.bias_strength.values)

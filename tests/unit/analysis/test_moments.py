"""The clouds' moments shared by PCA, the rotation model and plasticity (qkplast.analysis.moments)."""

import numpy as np
import torch

from qkplast.analysis.moments import cloud_moments


def clouds(rng, heads=3, n=50, dim=6):
    t = np.sort(rng.choice(4096, n, replace=False)).astype(float)
    q = rng.normal(size=(heads, n, dim)) + 40.0 + 0.01 * t[None, :, None]  # large means, a drift
    k = rng.normal(size=(heads, n, dim)) - 7.0
    return q.astype(np.float32), k.astype(np.float32), t


def test_moments_equal_numpy(rng):
    q, k, t = clouds(rng)
    m = cloud_moments(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(t))
    for x, mean, centred, cross, scatter in ((q, m.mean_q, m.centred_q, m.cross_q, m.scatter_q),
                                            (k, m.mean_k, m.centred_k, m.cross_k, m.scatter_k)):
        x = x.astype(float)
        xc = x - x.mean(1, keepdims=True)
        np.testing.assert_allclose(mean.numpy(), x.mean(1), rtol=1e-13)
        np.testing.assert_allclose(centred.numpy(), xc, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(cross.numpy(), np.einsum("hsd,s->hd", xc, t - t.mean()), rtol=1e-11)
        np.testing.assert_allclose(scatter.numpy(), np.einsum("hsd,hse->hde", xc, xc), rtol=1e-11)
    assert m.n == q.shape[1]
    np.testing.assert_allclose(float(m.stt), ((t - t.mean()) ** 2).sum(), rtol=1e-14)
    np.testing.assert_allclose(m.beta_q.numpy(), np.polyfit(t, q.astype(float).transpose(1, 0, 2).reshape(len(t), -1), 1)[0]
                               .reshape(q.shape[0], -1), rtol=1e-9)


def test_sums_of_squares_agree_with_and_without_scatter(rng):
    q, k, t = clouds(rng)
    args = torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(t)
    full, light = cloud_moments(*args), cloud_moments(*args, scatter=False)
    assert light.scatter_q is None and light.scatter_k is None
    v = torch.nn.functional.normalize(torch.from_numpy(rng.normal(size=(q.shape[0], q.shape[2]))), dim=-1)
    for a, b in zip(full.sum_of_squares(v), light.sum_of_squares(v)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    np.testing.assert_allclose(full.total_sum_of_squares().numpy(), light.total_sum_of_squares().numpy(), rtol=1e-12)


def test_float64_inputs_are_not_centred_in_place(rng):
    q, k, t = clouds(rng)
    q64, k64 = torch.from_numpy(q.astype(float)), torch.from_numpy(k.astype(float))
    before = q64.clone(), k64.clone()
    cloud_moments(q64, k64, torch.from_numpy(t))
    assert torch.equal(q64, before[0]) and torch.equal(k64, before[1])

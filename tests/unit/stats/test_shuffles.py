"""Position-shuffle nulls (qkplast.stats.shuffles): the drift-axis parts from the position sums, the shuffle's
observed value against the unshuffled statistic, and the sign-agreement null on a planted capture."""

import warnings

import numpy as np
import pytest
import torch

import qkplast
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.stats.shuffles import drift_axis_parts, key_slope_sign_null, position_shuffle_null
from qkplast.theory.planted import planted_capture


def test_drift_axis_parts_split_the_slope_on_the_drift_axis(rng):
    b_q, b_k = (torch.as_tensor(rng.normal(size=(3, 5, 4))) for _ in range(2))  # [head, perm, dim]
    mu_q = torch.as_tensor(rng.normal(size=(3, 4)))
    bias, slope = drift_axis_parts(b_q, b_k, mu_q)
    a = (b_q + b_k) / torch.linalg.vector_norm(b_q + b_k, dim=-1, keepdim=True)
    torch.testing.assert_close(bias, torch.einsum("hd,hpd->hp", mu_q, a) * torch.einsum("hpd,hpd->hp", a, b_k))
    torch.testing.assert_close(slope, torch.einsum("hd,hpd->hp", mu_q, b_k))
    # key sums on the drift axis (queries drifting with the keys): the whole slope is on it, whatever the mean query
    on_axis_bias, on_axis_slope = drift_axis_parts(b_k, b_k, mu_q)
    torch.testing.assert_close(on_axis_bias, on_axis_slope)
    assert not torch.allclose(bias, slope)  # keys drifting off the pooled axis: a part of the slope is off it


@pytest.fixture(scope="module")
def drifting():
    cap, _ = planted_capture(n_heads=6, dim=8, seq_len=1024, bucket_size=128, n_docs=4, samples_per_bucket=4, seed=2)
    return cap


def test_position_shuffle_null_observes_the_unshuffled_statistic(drifting):
    """The observed value is the statistic on the centred positions; the null's are on permutations of them, so
    the mean key-position sum, which a shuffle scatters around zero, is far in the null's tail."""
    cap = drifting

    def key_sum_norm(b_q, b_k, mu_q, stt):
        return torch.linalg.vector_norm(b_k, dim=-1).mean(0) / stt  # [perm]

    res = position_shuffle_null(cap, key_sum_norm, n_perm=30, seed=1, chunk=7)  # chunks of unequal size
    k = cap.k.values.astype(float)
    tc = cap.position.values.astype(float) - cap.position.values.mean()
    want = np.linalg.norm(np.einsum("hsd,s->hd", k - k.mean(1, keepdims=True), tc), axis=-1).mean() / (tc @ tc)
    assert res["observed"] == pytest.approx(want, rel=1e-10)
    assert res["null"].shape == (30,) and res["observed"] > res["null"].max()


def test_key_slope_sign_null_separates_planted_drift_from_a_shuffle(drifting):
    cap = drifting
    res = key_slope_sign_null(cap, n_perm=40, seed=0, chunk=16)
    assert res["null"].shape == (40,) and ((0 <= res["null"]) & (res["null"] <= 1)).all()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)  # bucket 0 has no pairs: irrelevant to the signs
        rot = qkplast.analyze(cap, n_pairs=8)
    want = float((np.sign(rot.key_position_slope) == np.sign(rot.bias_strength)).mean())
    assert res["observed"] == pytest.approx(want)
    # the shuffle is a permutation: the same seed gives the same null
    np.testing.assert_array_equal(res["null"], key_slope_sign_null(cap, n_perm=40, seed=0, chunk=16)["null"])

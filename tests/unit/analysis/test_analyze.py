"""qkplast.analyze: the documented metrics, labels and attrs; invariances; input validation."""

import warnings

import numpy as np
import pytest

import qkplast
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.theory.planted import planted_capture, random_orthogonal

REQUIRED = {
    ("head", "pc"): ["r_q_pc", "r_k_pc", "explained_variance_ratio"],
    ("head",): ["taxonomy", "r_q_a", "r_k_a", "alpha_q", "alpha_k", "mu_q_a", "bias_strength",
                "plane_variance_fraction", "separation_strength", "ap_overall", "ap_first20", "ap_last20", "ap_drop",
                "key_position_slope", "key_position_ratio"],
    ("head", "query_bucket"): ["ap", "ap_mc", "ap_mc_se"],
    ("head", "key_distance", "query_distance"): ["ap_map", "ap_mc_map"],
}


@pytest.fixture(scope="module")
def result():
    cap, _ = planted_capture(n_heads=5, dim=16, n_docs=24, samples_per_bucket=4, seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        return cap, qkplast.analyze(cap, n_pairs=64)


def test_has_every_documented_variable(result):
    cap, m = result
    for dims, names in REQUIRED.items():
        for name in names:
            assert m[name].dims == dims, name
    for name in ("layer", "q_head", "kv_head", "rope"):
        np.testing.assert_array_equal(m[name].values, cap[name].values)
    assert m.attrs["options"]["n_pairs"] == 64 and m.attrs["capture"]["model"] == cap.attrs["model"]
    assert not np.isnan(m.bias_strength).any() and not np.isnan(m.ap_drop).any()


def test_metrics_round_trip(result, tmp_path):
    _, m = result
    path = qkplast.save_dataset(m, tmp_path / "m.nc")
    back = qkplast.open_dataset(path)
    assert back.identical(m)


def test_all_metrics_invariant_under_one_orthogonal_transform_of_q_and_k(result, rng):
    cap, m = result
    r = random_orthogonal(rng, 1, cap.sizes["dim"])[0]
    moved = cap.assign(q=(cap.q.dims, cap.q.values @ r.T), k=(cap.k.dims, cap.k.values @ r.T))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        full_a = qkplast.analyze(cap, n_pairs=64, covariance="full")
        full_b = qkplast.analyze(moved, n_pairs=64, covariance="full")
    scalars = ["r_q_a", "r_k_a", "alpha_q", "alpha_k", "mu_q_a", "bias_strength", "plane_variance_fraction",
               "separation_strength", "ap", "ap_mc", "ap_overall", "ap_drop", "ap_map"]
    for name in scalars:
        np.testing.assert_allclose(full_b[name], full_a[name], rtol=1e-7, atol=1e-10, err_msg=name)
    np.testing.assert_allclose(full_b.explained_variance_ratio, full_a.explained_variance_ratio, atol=1e-12)
    # leading PCs are well separated here, so their correlations are defined and must agree
    np.testing.assert_allclose(full_b.r_q_pc[:, :3], full_a.r_q_pc[:, :3], atol=1e-8)
    assert (full_b.taxonomy == full_a.taxonomy).all()


def test_rejects_nan_capture(result):
    cap, _ = result
    q = cap.q.values.copy()
    q[2, 7, 0] = np.nan
    with pytest.raises(qkplast.CaptureError, match="head 2"):
        qkplast.analyze(cap.assign(q=(cap.q.dims, q)))


@pytest.mark.parametrize("value", [np.inf, -np.inf, np.nan])
def test_non_finite_keys_in_a_later_chunk_name_head_and_sample(result, value):
    """analyze() finds NaN and Inf chunk by chunk (through the clouds' means): the message names the head of the
    whole capture, not of the chunk."""
    cap, _ = result
    k = cap.k.values.copy()
    k[4, 11, 3] = value
    with pytest.raises(qkplast.CaptureError, match=r"'k' has NaN or Inf in 1 vectors; first at head 4 .*, sample 11"):
        qkplast.analyze(cap.assign(k=(cap.k.dims, k)), head_chunk=1)


def test_unknown_option(result):
    with pytest.raises(TypeError, match="unknown analysis option"):
        qkplast.analyze(result[0], bogus=1)


def test_open_questions_can_be_left_out(result):
    """open_questions=False drops only the chapter's own metrics; every thesis metric is the same."""
    cap, m = result
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        thesis = qkplast.analyze(cap, n_pairs=64, open_questions=False)
    assert "ap_set" in m and "ap_drop_bias" in m
    assert "ap_set" not in thesis and "ap_drop_bias" not in thesis
    for name in thesis.data_vars:
        np.testing.assert_array_equal(thesis[name].values, m[name].values)
    assert thesis.attrs["options"]["open_questions"] is False


def test_one_pass_over_the_heads_equals_the_three_analyses_run_apart(result):
    """analyze() shares each chunk's moments between PCA, rotation and plasticity, on every core; the
    public functions run alone, one chunk of heads at a time, give the same numbers."""
    import torch

    from qkplast.analysis.pca import pca
    from qkplast.analysis.plasticity import plasticity
    from qkplast.analysis.rotation import rotation

    cap, m = result
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # in order, in the calling thread
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlasticityWarning)
            apart = [pca(cap, head_chunk=2), rotation(cap, head_chunk=3), plasticity(cap, n_pairs=64, head_chunk=1)]
    finally:
        torch.set_num_threads(before)
    for part in apart:
        for name, var in part.data_vars.items():
            if var.dtype.kind == "f":
                np.testing.assert_allclose(m[name].values, var.values, rtol=1e-10, atol=1e-12, err_msg=name)
            else:
                np.testing.assert_array_equal(m[name].values, var.values, err_msg=name)

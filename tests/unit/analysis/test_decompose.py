"""AP_drop decomposition (beyond the thesis): exact identity and the two planted worlds."""

import warnings

import numpy as np
import pytest

from qkplast.analysis.decompose import VARIANTS, counterfactual_model, decompose_drop, parts_from_drops
from qkplast.analysis.plasticity import PlasticityWarning, plasticity
from qkplast.theory.planted import planted_capture


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)  # bucket 0 has no earlier keys by design
        return fn(*args, **kw)


def shrinking_content(capture, truth, floor=0.1):
    """The planted capture with the query content spread shrinking linearly from 1 to ``floor`` over the context."""
    rot = truth.rotation
    planted = np.einsum("hji,hsj->hsi", rot, capture.q.values)  # back to the planted basis
    f = 1.0 - (1.0 - floor) * capture.position.values / capture.attrs["seq_len"]
    planted[..., 1:] = truth.mu_sem[:, None] + f[None, :, None] * (planted[..., 1:] - truth.mu_sem[:, None])
    return capture.assign(q=(("head", "sample", "dim"), np.einsum("hij,hsj->hsi", rot, planted)))


@pytest.fixture(scope="module")
def drifting():
    return planted_capture(n_heads=4, dim=16, n_docs=32, samples_per_bucket=4, beta_pos=2e-3, seed=3)[0]


@pytest.mark.parametrize("covariance", ["diagonal", "full"])
def test_parts_add_up_to_ap_drop_exactly(drifting, covariance):
    ap_drop = quiet(plasticity, drifting, covariance=covariance).ap_drop.values
    d = quiet(decompose_drop, drifting, covariance=covariance, ap_drop=ap_drop)
    total = d.ap_drop_bias + d.ap_drop_content + d.ap_drop_interaction
    assert np.abs(total.values - ap_drop).max() < 1e-12
    # the recomputed factual model is the analysed one, so Drop(1, 1) alone reproduces ap_drop
    recomputed = quiet(decompose_drop, drifting, covariance=covariance)
    assert np.abs(recomputed.ap_drop_interaction.values - d.ap_drop_interaction.values).max() < 1e-10
    prof = quiet(plasticity, drifting, covariance=covariance).ap.values
    assert np.nanmax(np.abs(d.ap_counterfactual.sel(variant="P1C1").values - prof)) < 1e-12


def test_drift_with_constant_content_has_no_content_part(drifting):
    d = quiet(decompose_drop, drifting)
    assert (d.ap_drop_bias > 0.5).all()  # the planted drift makes the whole drop
    assert np.abs(d.ap_drop_content).max() < 0.03
    assert np.abs(d.ap_drop_interaction).max() < 0.03


def test_no_drift_with_shrinking_content_has_no_bias_part():
    cap, truth = planted_capture(n_heads=4, dim=16, n_docs=32, samples_per_bucket=4, beta_pos=0.0, key_slope=0.0, seed=4)
    d = quiet(decompose_drop, shrinking_content(cap, truth))
    assert np.abs(d.ap_drop_bias).max() < 0.03
    assert (d.ap_drop_content > 0.15).all()  # the shrinking spread makes late scores decisive
    # the same world without the shrinking spread: no content part either (the test above is not vacuous)
    flat = quiet(decompose_drop, cap)
    assert np.abs(flat.ap_drop_content).max() < 0.03


def test_counterfactual_model_switches():
    import torch

    from qkplast.analysis.plasticity import QueryModel

    mean = torch.rand(1, 3, 4, dtype=torch.float64)
    cov = torch.rand(1, 3, 4, dtype=torch.float64) + 0.1
    model = QueryModel(mean, cov, False, *(torch.zeros(1, dtype=torch.float64),) * 3)
    counts = torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64)
    off = counterfactual_model(model, counts, positional=False, content=True)
    assert torch.equal(off.mean[..., 0], torch.zeros(1, 3, dtype=torch.float64)) and torch.equal(off.cov[..., 0], torch.zeros(1, 3, dtype=torch.float64))
    assert torch.equal(off.mean[..., 1:], mean[..., 1:])
    fixed = counterfactual_model(model, counts, positional=True, content=False)
    expect = (mean[0, :, 1:] * torch.tensor([[0.25], [0.5], [0.25]], dtype=torch.float64)).sum(0)
    assert torch.allclose(fixed.mean[0, :, 1:], expect.expand(3, -1)) and torch.equal(fixed.mean[..., 0], mean[..., 0])
    assert torch.equal(model.mean, mean)  # the fitted model is not modified in place


def test_parts_from_drops_definitions():
    drops = np.array([[0.5], [0.4], [0.1], [0.05]])  # Drop(1,1), Drop(1,0), Drop(0,1), Drop(0,0) in VARIANTS order
    assert VARIANTS == ((1, 1), (1, 0), (0, 1), (0, 0))
    parts = parts_from_drops(drops)
    assert parts["ap_drop_bias"][0] == pytest.approx(0.35) and parts["ap_drop_content"][0] == pytest.approx(0.1)
    assert parts["ap_drop_interaction"][0] == pytest.approx(0.05) and parts["ap_drop_keys"][0] == pytest.approx(0.05)

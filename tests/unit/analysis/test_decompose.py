"""AP_drop decomposition (beyond the thesis): exact identity, the parts' definitions, and planted worlds where
the right split is known (key drift off the query axis, content-only change, drift-only, both)."""

import warnings

import numpy as np
import pytest

from qkplast.analysis.decompose import TERMS, VARIANTS, decompose_drop, model_level_terms, terms_from_drops
from qkplast.analysis.metrics import analyze
from qkplast.analysis.plasticity import PlasticityWarning, plasticity
from qkplast.theory.planted import planted_capture


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)  # bucket 0 has no earlier keys by design
        return fn(*args, **kw)


def world(query_mean_on_key_axis: float = 0.0, **kw):
    """A planted capture; ``query_mean_on_key_axis`` moves the queries' mean along the keys' drift direction
    (then the drift of the keys changes the mean score difference far more than its spread)."""
    cap, truth = planted_capture(n_heads=4, dim=16, n_docs=32, samples_per_bucket=4, seed=4, **kw)
    if query_mean_on_key_axis:
        axis = truth.rotation[:, :, kw.get("key_axis", 0)]  # [head, dim] drift direction in the captured basis
        cap = cap.assign(q=cap.q + query_mean_on_key_axis * cap.q.copy(data=np.broadcast_to(axis[:, None], cap.q.shape)))
    return cap


@pytest.fixture(scope="module")
def drifting():
    return planted_capture(n_heads=4, dim=16, n_docs=32, samples_per_bucket=4, beta_pos=2e-3, seed=3)[0]


@pytest.mark.parametrize("covariance", ["diagonal", "full"])
def test_parts_add_up_to_ap_drop_exactly(drifting, covariance):
    ap_drop = quiet(plasticity, drifting, covariance=covariance).ap_drop.values
    d = quiet(decompose_drop, drifting, covariance=covariance, ap_drop=ap_drop)
    total = sum(d[name] for name in TERMS)
    assert np.abs(total.values - ap_drop).max() < 1e-12
    # the recomputed factual model is the analysed one, so Drop(1, 1) alone reproduces ap_drop
    recomputed = quiet(decompose_drop, drifting, covariance=covariance)
    assert np.abs(recomputed.ap_drop_interaction.values - d.ap_drop_interaction.values).max() < 1e-10
    prof = quiet(plasticity, drifting, covariance=covariance).ap.values
    assert np.nanmax(np.abs(d.ap_counterfactual.sel(variant="P1C1").values - prof)) < 1e-12


def test_analyze_computes_the_same_parts_in_its_own_pass(drifting):
    m = quiet(analyze, drifting, set_sizes=(2,))
    d = quiet(decompose_drop, drifting)
    for name in TERMS:
        np.testing.assert_allclose(m[name].values, d[name].values, rtol=0, atol=1e-12)
    assert float(abs(sum(m[name] for name in TERMS) - m.ap_drop).max()) < 1e-12


def test_drift_on_the_query_axis_is_the_bias_part(drifting):
    d = quiet(decompose_drop, drifting)
    assert (d.ap_drop_bias > 0.5).all()  # the planted drift makes the whole drop
    for name in ("ap_drop_baseline", "ap_drop_content", "ap_drop_interaction"):
        assert np.abs(d[name]).max() < 0.03, name


def test_key_drift_off_the_query_axis_is_the_bias_part_not_content():
    """Only the keys drift, along a direction orthogonal to the query drift, and no content statistic moves:
    the whole drop is drift. (Earlier versions kept only the query-drift coordinate as positional and filed
    this drop under content and the keys' baseline.)"""
    d = quiet(decompose_drop, world(3.0, beta_pos=1e-9, key_slope=2e-3, key_axis=3))
    assert (d.ap_drop_bias > 0.2).all()
    assert np.abs(d.ap_drop_content).max() < 0.03 and np.abs(d.ap_drop_baseline).max() < 0.06
    assert np.abs(d.ap_drop_interaction).max() < 0.03


def test_content_change_alone_is_the_content_part():
    d = quiet(decompose_drop, world(beta_pos=0.0, key_slope=0.0, content_floor=0.1))
    assert np.abs(d.ap_drop_bias).max() < 0.03
    assert (d.ap_drop_content > 0.15).all()  # the shrinking spread makes late scores decisive
    # the same world without the shrinking spread: no content part either (the check above is not vacuous)
    flat = quiet(decompose_drop, world(beta_pos=0.0, key_slope=0.0))
    assert np.abs(flat.ap_drop_content).max() < 0.03


def test_drift_and_content_change_together_split_into_both():
    both = quiet(decompose_drop, world(3.0, beta_pos=1e-9, key_slope=1e-3, key_axis=3, content_floor=0.2))
    drift = quiet(decompose_drop, world(3.0, beta_pos=1e-9, key_slope=1e-3, key_axis=3))
    assert (both.ap_drop_bias > 0.15).all() and (both.ap_drop_content > 0.15).all()
    # the drift part is what the drift alone produces; the content change does not leak into it
    np.testing.assert_allclose(both.ap_drop_bias, drift.ap_drop_bias, atol=0.03)
    assert (np.abs(both.ap_drop_interaction) < 0.5 * np.minimum(both.ap_drop_bias, both.ap_drop_content)).all()


def test_terms_from_drops_definitions():
    drops = np.array([[0.5], [0.4], [0.1], [0.05]])  # Drop(1,1), Drop(1,0), Drop(0,1), Drop(0,0) in VARIANTS order
    assert VARIANTS == ((1, 1), (1, 0), (0, 1), (0, 0))
    parts = terms_from_drops(drops)
    assert parts["ap_drop_baseline"][0] == pytest.approx(0.05) and parts["ap_drop_bias"][0] == pytest.approx(0.35)
    assert parts["ap_drop_content"][0] == pytest.approx(0.05)
    assert parts["ap_drop_interaction"][0] == pytest.approx(0.5 - 0.4 - 0.1 + 0.05)
    assert sum(parts[name][0] for name in TERMS) == pytest.approx(0.5)


def test_model_level_terms_are_means_over_heads(drifting):
    d = quiet(decompose_drop, drifting)
    means = quiet(model_level_terms, drifting)
    assert list(means) == ["ap_drop", *TERMS]
    for name in TERMS:
        assert means[name] == pytest.approx(float(d[name].mean()))
    assert means["ap_drop"] == pytest.approx(sum(means[name] for name in TERMS))

"""Theory checks (Lemma A.1, Lemma A.2, Theorem 4.4): they pass where the claims hold and fail where they don't."""

import numpy as np
import pytest

from qkplast.theory import checks as theory


def test_lemma_a1_passes_and_reports_diagonal_gap():
    res = theory.check_lemma_a1(n_draws=100_000)
    assert res.passed, res
    assert res.details["max_abs_z"] < 5
    # correlated semantic covariance: eq. 4.12's diagonal variance is off by several percent for some pair
    assert max(abs(res.details["v_ratio_min"] - 1), abs(res.details["v_ratio_max"] - 1)) > 0.05
    diag = theory.check_lemma_a1(n_draws=20_000, correlated=False)
    np.testing.assert_allclose(diag.table["v_diag_over_v"], 1.0, rtol=1e-12)


@pytest.mark.parametrize("scale", [0.97, 1.03])
def test_lemma_a1_detects_a_misspecified_variance(scale):
    # a 3% error in the variance at 50000 draws: the largest |z| is about 11 (measured), far past the check's 5
    res = theory.check_lemma_a1(n_draws=50_000, misspecify=scale)
    assert not res.passed and res.details["max_abs_z"] > 8, res


@pytest.mark.parametrize("route", ["thesis", "sharp"])
def test_lemma_a2_bound_holds_after_t0(route):
    res = theory.check_lemma_a2(n_params=300, route=route)
    assert res.passed, res
    assert res.details["max_ratio"] <= 1 + 1e-12


def test_lemma_a2_condition_t0_is_needed():
    res = theory.check_lemma_a2(n_params=300, route="sharp")
    assert res.details["n_fail_before_T0"] > 0  # below T0 z(t) can cross 0 where PP = 1 > the bound


def test_lemma_a2_constants():
    c0, t0 = theory.lemma_a2_constants(np.array([0.5, -2.0]), np.array([0.2, 3.0]), route="thesis")
    np.testing.assert_allclose(c0, 4 / np.sqrt(2 * np.pi))
    np.testing.assert_allclose(t0, [2 * 1.0 / 0.5, 2 * 3.0 / 2.0])
    c0, t0 = theory.lemma_a2_constants(np.array([0.5]), np.array([0.2]), route="sharp")
    np.testing.assert_allclose([c0[0], t0[0]], [1.0, 0.8])
    with pytest.raises(ValueError):
        theory.lemma_a2_constants(np.ones(1), np.ones(1), route="other")


@pytest.mark.parametrize("route, pi0", [("sharp", 0.1), ("thesis", 0.0)])
def test_theorem_4_4_aggregate_bound(route, pi0):
    res = theory.check_theorem_4_4(route=route, pi0=pi0)
    assert res.passed, res
    assert (res.table["AP_t"] <= res.table["bound"] + 1e-12).all()
    if pi0 == 0:
        assert res.details["AP_inf"] == 0


def test_aggregate_bound_fails_with_too_large_c():
    """The bound starts at T = max T0, where most pairs have already decayed, so it is loose;
    still, a rate c a hundred times too large must break it."""
    res = theory.check_theorem_4_4()
    b = res.details
    t = res.table["t"].to_numpy()
    wrong = b["AP_inf"] + b["C"] * np.exp(-100 * b["c"] * t**2)
    assert (res.table["AP_t"].to_numpy() > wrong).any()


def test_sharp_inequality_terms_follow_the_square_and_disk_proof():
    res = theory.sharp_inequality(np.linspace(0, 6, 61))
    # square >= disk, and the two sides are 1 - square and 1 - disk
    assert (res["P(square)"] >= res["P(disk)"] - 1e-15).all()
    np.testing.assert_allclose(res["4 Phi(z) Phi(-z)"], 1 - res["P(square)"], atol=1e-12)
    np.testing.assert_allclose(res["exp(-z^2/2)"], 1 - res["P(disk)"], atol=1e-12)
    assert (res["4 Phi(z) Phi(-z)"] <= res["exp(-z^2/2)"]).all() and res["4 Phi(z) Phi(-z)"][0] == 1.0


def test_population_ap_with_drifting_keys_under_the_prefix_law_falls_like_log_t_over_t_squared():
    np.testing.assert_allclose(theory.prefix_pair_distances(50).sum(), 1.0, rtol=1e-12)
    res = theory.check_population_rate_drifting()
    assert res.passed, res
    # without drift the same prefix law is a fixed law in delta_1: back to 1/t
    t = np.array([100, 1000])
    flat = theory.population_ap_prefix_drift(t, key_drift=0.0)
    np.testing.assert_allclose(t * flat, theory.population_rate_limit(), rtol=0.02)


def test_population_ap_decays_like_one_over_t():
    res = theory.check_population_rate()
    assert res.passed, res
    np.testing.assert_allclose(res.details["limit"], 4 / (np.pi * np.sqrt(2)), rtol=1e-12)  # 0.9003
    t_ap = res.table["t_AP_t"].to_numpy()
    assert 0.89 < t_ap.min() and t_ap.max() < 0.901  # t AP_t stays at 0.90 from t = 10 to 10^4
    np.testing.assert_allclose(res.table["AP_t"], res.table["AP_t_closed_form"], rtol=1e-8)
    # any exp(-c t^2) law: with c fitted at t = 10 it would already be 0 at t = 100
    c = -np.log(res.table["AP_t"].iloc[0]) / 100
    assert np.exp(-c * 100**2) < 1e-40 < res.table["AP_t"].iloc[10]


def test_population_rate_limit_ignores_intercepts_and_scales_with_parameters():
    shifted = theory.check_population_rate(alpha=3.0, z0=1.5)
    assert shifted.passed, shifted
    np.testing.assert_allclose(shifted.details["limit"], theory.population_rate_limit())
    scaled = theory.check_population_rate(sigma_delta=2.0, v=3.0, beta=0.5)
    assert scaled.passed, scaled
    np.testing.assert_allclose(scaled.details["limit"], 0.9003163161571061 * np.sqrt(3) / 0.5 / 2)
    # the check can fail: at t <= 20 t AP_t is still 0.4% below its limit
    assert not theory.check_population_rate(rtol=1e-6, t=[10, 20]).passed


def test_bound_start_summary_rounds_the_median_and_brackets_every_head():
    import pandas as pd

    bounds = pd.DataFrame({"T_over_window": [333.0, 3796.0, 3801.0, 5000.0, 367814.0]})
    assert theory.bound_start_summary(bounds) == {"median": 3800.0, "lo_exp": 2, "hi_exp": 6}
    # the largest T moving by 10 % between machines leaves the summary as it was
    moved = bounds.assign(T_over_window=[333.0, 3796.0, 3801.0, 5000.0, 403709.0])
    assert theory.bound_start_summary(moved) == theory.bound_start_summary(bounds)
    with pytest.raises(ValueError, match="positive"):
        theory.bound_start_summary(pd.DataFrame({"T_over_window": [0.0, 5.0]}))


@pytest.mark.parametrize("arch", ["mllama", "qwen3"])
def test_chapter_01_rope_figure_for_a_composite_model(arch):
    """Chapter 01 on Llama 3.2 Vision: the rotary class of the text model (``mllama_text_model``, kept in the
    ``mllama`` modeling file) passes the relative-position check and draws the frequency figure."""
    from tests.hub_fixtures import tiny_config

    import qkplast.results.figures as qp
    from qkplast.theory.rope import check_relative_property, frequency_table, model_rotary

    rope = model_rotary(tiny_config(arch))
    text = tiny_config(arch).get_text_config()
    assert rope.model_type == text.model_type and rope.max_positions == text.max_position_embeddings
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    assert rope.head_dim == head_dim and len(rope.inv_freq) == head_dim // 2
    check = check_relative_property(rope, n=64, max_position=4096, seed=0)
    assert check.passed, check
    table = frequency_table(rope)
    assert len(table) == head_dim // 2 and (table.wavelength_tokens.diff().dropna() > 0).all()
    fig = qp.rope_frequencies(table, {"capture window": 4096, "model maximum": rope.max_positions})
    assert len(fig.axes) >= 1 and fig.axes[0].lines

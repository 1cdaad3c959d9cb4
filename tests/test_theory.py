"""Theory checks (Lemma A.1, Lemma A.2, Theorem 4.4): they pass where the claims hold and fail where they don't."""

import numpy as np
import pytest

from qkplast import theory


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
    assert not theory.check_lemma_a1(n_draws=200_000, misspecify=scale).passed


@pytest.mark.parametrize("route", ["thesis", "sharp"])
def test_lemma_a2_bound_holds_after_t0(route):
    res = theory.check_lemma_a2(n_params=300, route=route)
    assert res.passed, res
    assert res.details["max_ratio"] <= 1 + 1e-12
    assert res.details["sharp_inequality"]


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

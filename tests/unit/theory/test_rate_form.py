"""The drifting-key rate check tells log t / t^2 from a pure power (qkplast.theory.checks.check_rate_form)."""

import numpy as np
import pytest

from qkplast.theory import checks as theory

# the range and spacing of check_population_rate_drifting's fitted part: 18 positions from about 300 to 10^5
T = np.unique(np.logspace(np.log10(30), 5, 25).astype(int))
T = T[T >= 300]


@pytest.mark.parametrize("slope", [-1.7, -1.85, -2.0])
def test_a_pure_power_fails(slope):
    res = theory.check_rate_form(T, 3.0 * T**slope)
    assert not res.passed, res
    assert res.details["slope"] == pytest.approx(slope, abs=1e-9) and res.details["rms_power"] < 1e-12


@pytest.mark.parametrize("c", [0.0, 3.0])
def test_log_t_over_t_squared_passes(c):
    res = theory.check_rate_form(T, 2.0 * (np.log(T) - c) / T**2)
    assert res.passed, res
    assert res.details["c"] == pytest.approx(c, abs=1e-4) and res.details["K"] == pytest.approx(2.0, rel=1e-4)
    assert res.details["preference"] > 1e3


def test_the_population_with_drifting_keys_prefers_the_log_law_by_the_margin():
    res = theory.check_population_rate_drifting()
    assert res.passed, res
    assert res.details["preference"] >= 10 and -1.9 < res.details["slope"] < -1.7
    # the same fit against a t^-1.7 sequence of the same level fails
    fitted = res.table[res.table.fitted]
    t = fitted.t.to_numpy(float)
    pure = fitted.AP_t.iloc[0] * (t / t[0]) ** -1.7
    assert not theory.check_rate_form(t, pure).passed


def test_truncated_distances_change_nothing():
    """population_ap_prefix_drift leaves out distances whose drift is more than 40 noise sd away: exact in float64."""
    t = np.array([400, 3000])
    full = []
    for tt in t:  # the untruncated sum, written out
        from scipy import stats
        from scipy.integrate import simpson
        p = theory.prefix_pair_distances(tt)
        d = np.arange(1, len(p) + 1)
        u = np.linspace(-12.0, 12.0, 4001)
        s = 1.0 / tt
        dens = stats.norm.pdf(u[None, :] * s, loc=0.05 * d[:, None], scale=1.0)
        full.append(float((p * s * simpson(theory.pp_from_z(u) * dens, x=u, axis=-1)).sum()))
    np.testing.assert_allclose(theory.population_ap_prefix_drift(t, 0.05), full, rtol=1e-13)


def test_rate_forms_rejects_unusable_input():
    with pytest.raises(ValueError, match="t > 1 with finite AP_t > 0"):
        theory.rate_forms(T, -T**-2.0)


def test_the_normal_density_is_scipy_s_bit_for_bit():
    """population_ap_prefix_drift's density: scipy.stats.norm.pdf's operations without its argument handling."""
    from scipy import stats

    u = np.linspace(-12.0, 12.0, 4001)
    for s, drift, scale in ((0.37, 0.05, 1.0), (1e-3, 0.2, 0.5), (2.5, 1.0, 3.0)):
        d = np.arange(1, 300)
        want = stats.norm.pdf(u[None, :] * s, loc=drift * d[:, None], scale=scale)
        np.testing.assert_array_equal(theory.normal_pdf(u[None, :] * s, drift * d[:, None], scale), want)

"""The power of the seed-level t test (qkplast.stats.power) against a simulation of the test itself and against
the noncentral-t grid search chapter 10 defined in its notebook."""

import numpy as np
import pytest
from scipy import stats

from qkplast.stats.power import detectable_effect, t_power


def simulated_power(effect: float, n: int, alpha: float, reps: int = 200_000, seed: int = 0) -> float:
    """Share of ``reps`` two-sided one-sample t tests on normal(effect, 1) samples of ``n`` that reject at ``alpha``."""
    x = np.random.default_rng(seed).normal(effect, 1.0, (reps, n))
    t = x.mean(1) / (x.std(1, ddof=1) / np.sqrt(n))
    return float(np.mean(2 * stats.t.sf(np.abs(t), n - 1) < alpha))


@pytest.mark.parametrize("n, alpha", [(3, 0.05), (5, 0.01), (8, 0.05 / 7)])
def test_the_detectable_effect_is_detected_with_the_stated_power_in_simulation(n, alpha):
    effect = detectable_effect(n, alpha)
    assert t_power(effect, n, alpha) == pytest.approx(0.8, abs=1e-8)
    assert simulated_power(effect, n, alpha) == pytest.approx(0.8, abs=0.005)  # binomial SE 0.0009
    assert simulated_power(0.0, n, alpha) == pytest.approx(alpha, abs=0.002)  # and the level is the level
    assert t_power(0.0, n, alpha) == pytest.approx(alpha)


def test_same_semantics_as_the_chapters_grid_search():
    def notebook(n, alpha, power=0.8):  # chapter 10's definition before the library had one
        crit = stats.t.ppf(1 - alpha / 2, n - 1)
        grid = np.linspace(0.05, 40, 8000)
        achieved = stats.nct.sf(crit, n - 1, grid * np.sqrt(n)) + stats.nct.cdf(-crit, n - 1, grid * np.sqrt(n))
        return float(grid[np.argmax(achieved >= power)])

    for n in (3, 5, 8):
        for alpha in (0.01, 0.05):
            step = 40 / 7999  # the grid's spacing: its answer is the first grid point at or above the root
            assert 0 <= notebook(n, alpha) - detectable_effect(n, alpha) < step


def test_more_seeds_and_a_looser_level_detect_smaller_effects():
    assert detectable_effect(3, 0.01) > detectable_effect(3, 0.05) > detectable_effect(8, 0.05)
    assert detectable_effect(5, 0.05, alternative="greater") < detectable_effect(5, 0.05)  # one tail at full alpha
    assert detectable_effect(2, 1e-4) > 100  # the bracket widens until it holds the root
    for bad, match in (({"n": 1, "alpha": 0.05}, "two units"), ({"n": 5, "alpha": 1.5}, "alpha"),
                       ({"n": 5, "alpha": 0.05, "power": 0.01}, "power")):
        with pytest.raises(ValueError, match=match):
            detectable_effect(**bad)

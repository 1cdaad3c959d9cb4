"""stats.decision and stats.intervals: the one verdict rule, Holm's adjustment and the t interval over units."""

import numpy as np
import pytest

from qkplast.stats.intervals import t_interval
from qkplast.stats.decision import conjunction, holm, verdict


def test_holm_matches_the_step_down_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 -> 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    np.testing.assert_allclose(holm(p), [0.03, 0.06, 0.06, 0.02])
    assert np.isnan(holm([0.01, np.nan])[1]) and holm([0.01, np.nan])[0] == pytest.approx(0.01)
    assert holm([0.9, 0.8]).max() == 1.0


def test_verdict_words_follow_the_interval_the_p_value_and_the_margin():
    assert verdict(0.3, 0.1, 0.5, claim="greater") == "supported"
    assert verdict(0.3, 0.1, 0.5, 0.2, claim="greater") == "left open"  # does not survive the correction
    assert verdict(-0.3, -0.5, -0.1, 0.01, claim="greater") == "contradicted"
    assert verdict(-0.3, -0.5, -0.1, claim="less") == "supported"
    assert verdict(0.0, 0.0, 0.0, claim="greater", margin=0.01) == "no effect"  # a tight null, not left open
    assert verdict(0.0, -0.2, 0.2, claim="greater", margin=0.01) == "left open"
    assert verdict(0.001, -0.004, 0.005, claim="equivalent", margin=0.01) == "supported"
    assert verdict(0.5, 0.3, 0.7, 0.001, claim="equivalent", margin=0.1) == "contradicted"
    assert verdict(np.nan, np.nan, np.nan) == "left open"
    with pytest.raises(ValueError, match="margin"):
        verdict(0.0, -1, 1, claim="equivalent")


def test_a_conjunction_is_supported_only_when_every_part_is():
    assert conjunction(["supported", "supported"]) == "supported"
    assert conjunction(["supported", "left open"]) == "left open"
    assert conjunction(["supported", "contradicted"]) == "contradicted"
    assert conjunction(["no effect", "no effect"]) == "no effect"
    with pytest.raises(ValueError):
        conjunction(["maybe"])


def test_a_part_that_is_not_testable_makes_the_claim_not_testable_unless_another_part_contradicts_it():
    """A reading on a model that failed a gate cannot support a claim: the whole is "not testable", naming every
    failed gate once; a contradicted part still contradicts the whole (it was decided on a model that passed)."""
    assert conjunction(["supported", "not testable (gate: copy, sink)"]) == "not testable (gate: copy, sink)"
    assert conjunction(["not testable (gate: copy)", "not testable (gate: sink, copy)"]) == "not testable (gate: copy, sink)"
    assert conjunction(["contradicted", "not testable (gate: copy)"]) == "contradicted"
    assert conjunction(["left open", "not testable (gate: reach)"]) == "not testable (gate: reach)"
    with pytest.raises(ValueError):
        conjunction(["not sure (gate: copy)"])


@pytest.mark.parametrize("n", [3, 4, 8])
def test_t_interval_covers_at_its_level_with_few_units(n, rng):
    """2000 planted worlds of n unit values around a known mean: the 95% interval covers 93-97% of them."""
    truth = 0.7
    x = truth + rng.standard_normal((n, 2000)) * 0.3  # [unit, world]
    ci = t_interval(x, 0.95)
    cover = np.mean((ci["lo"] <= truth) & (truth <= ci["hi"]))
    assert 0.93 <= cover <= 0.97, cover
    assert ci["n"].tolist() == [n] * 2000


def test_t_interval_needs_two_units_and_skips_nan():
    one = t_interval([1.0])
    assert np.isnan(one["lo"]) and one["estimate"] == 1.0
    two = t_interval([1.0, np.nan, 3.0])
    assert two["n"] == 2 and two["estimate"] == 2.0 and two["lo"] < 2.0 < two["hi"]

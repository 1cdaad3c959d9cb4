"""The verdicts of a page's readings decided together (qkplast.stats.decision.holm_verdicts): Holm across the
readings, the interval where an item has one, undefined readings and intervals left open; the coverage target
(coverage_verdict)."""

import numpy as np

from qkplast.stats.decision import holm_verdicts


def test_holm_verdicts_apply_holm_and_the_interval():
    readings = [
        {"item": "a", "p": 0.001},
        {"item": "b", "p": 0.03},  # passes as the largest of 4, not as the second largest of 5
        {"item": "c", "p": 0.004, "estimate": 0.3, "lo": 0.1, "hi": 0.5, "claim": "greater"},
        {"item": "d", "p": 0.004, "estimate": -0.3, "lo": -0.5, "hi": 0.1, "claim": "less"},  # interval across 0
    ]
    out = holm_verdicts(readings)
    np.testing.assert_allclose(out["p (Holm)"], [0.004, 0.03, 0.012, 0.012])
    assert list(out.verdict) == ["confirmed", "confirmed", "confirmed", "left open"]
    out = holm_verdicts(readings + [{"item": "e", "p": 0.5}])
    assert out.loc["b", "verdict"] == "not distinguishable from the null"  # 0.03 x 2 after the step-down
    assert "Holm across 5" in out.attrs["rule"]
    out = holm_verdicts(readings + [{"item": "f", "p": np.nan}])  # undefined on this capture
    assert out.loc["f", "verdict"] == "left open" and np.isnan(out.loc["f", "p (Holm)"])
    np.testing.assert_allclose(out["p (Holm)"].iloc[:4], [0.004, 0.03, 0.012, 0.012])  # m counts 4, not 5
    # an item whose interval is undefined (too few effective documents) is not decided on its p alone
    undefined = {"item": "g", "p": 1e-6, "estimate": 0.3, "lo": np.nan, "hi": np.nan, "claim": "greater"}
    out = holm_verdicts(readings + [undefined])
    assert out.loc["g", "verdict"] == "left open" and out.loc["a", "verdict"] == "confirmed"


def test_an_interval_on_the_other_side_contradicts():
    readings = [{"item": "a", "p": 0.001, "estimate": -0.3, "lo": -0.5, "hi": -0.1, "claim": "greater"},
                {"item": "b", "p": 0.2, "estimate": -0.3, "lo": -0.5, "hi": -0.1, "claim": "greater"}]
    out = holm_verdicts(readings)
    assert list(out.verdict) == ["contradicted", "left open"]  # b's interval alone does not decide: p 0.2


def test_coverage_verdict_against_the_target_and_two_standard_errors():
    from qkplast.stats.decision import coverage_verdict
    from qkplast.stats.intervals import COVERAGE_TARGET

    assert coverage_verdict(COVERAGE_TARGET, 0.01) == "met"
    assert coverage_verdict(COVERAGE_TARGET - 0.015, 0.01) == "not met, within two standard errors of it"
    assert coverage_verdict(COVERAGE_TARGET - 0.025, 0.01) == "not met"
    assert coverage_verdict(0.9, 0.0, target=0.9) == "met" and coverage_verdict(0.89, 0.0, target=0.9) == "not met"

"""The content-decay conditions' readings (qkplast.stats.condition_readings): the decided family and the parts
described beside it, the Holm floor that says whether a reading can pass, no verdict on the parts outside the
family, and the section 7.6 reading computed from the verdicts."""

import numpy as np
import pandas as pd
import pytest

from qkplast.stats.condition_readings import QUANTITIES, describe_conditions, mechanism_reading, read_conditions


def tables(n_null: int, conditions=("a", "b", "c")):
    rng = np.random.default_rng(0)
    null = pd.DataFrame(rng.normal(0, 0.01, (n_null, len(QUANTITIES))), columns=list(QUANTITIES))
    diffs = pd.DataFrame([{"condition": c, "quantity": q, "estimate": e, "lo": e - 0.005, "hi": e + 0.005, "p_t": 0.01}
                          for c, e in zip(conditions, (0.2, 0.0, -0.2)) for q in QUANTITIES])
    return diffs, null


@pytest.mark.parametrize("n_null, can_pass", [(19, False), (59, False), (60, True), (199, True)])
def test_the_family_says_whether_its_readings_can_pass(n_null, can_pass):
    diffs, null = tables(n_null)
    r = read_conditions(diffs, null, "ap_drop_content")
    assert r.attrs["holm_floor"] == pytest.approx(3 / (n_null + 1)) and r.attrs["can_pass"] is can_pass
    # far beyond every null draw: supported exactly when the floor allows it
    assert (r.loc["a", "verdict"] == "supported") is can_pass and r.loc["b", "verdict"] == "left open"


def test_other_parts_are_described_without_a_verdict():
    diffs, null = tables(199)
    d = describe_conditions(diffs, null, ("ap_drop_bias", "ap_drop_interaction"))
    assert "verdict" not in d.columns and list(d.columns) == ["estimate", "lo", "hi", "share of null as far"]
    assert d.index.get_level_values("quantity").unique().tolist() == ["ap_drop_bias", "ap_drop_interaction"]
    assert d.loc[("ap_drop_bias", "a"), "share of null as far"] == pytest.approx(1 / 200)  # beyond every draw
    far = np.abs(null["ap_drop_bias"].to_numpy())
    assert d.loc[("ap_drop_bias", "b"), "share of null as far"] == pytest.approx((1 + np.sum(far >= 0.0)) / 200)
    assert d.attrs["n_null"] == 199


def test_mechanism_reading_follows_the_verdicts():
    r = pd.DataFrame({"verdict": ["supported", "left open", "left open"]}, index=["rope_x2", "bos", "window_2048"])
    assert "RoPE" in mechanism_reading(r) and "sink" in mechanism_reading(r)  # favours RoPE over sink competition
    r.loc["bos", "verdict"] = "supported"
    assert "do not single out" in mechanism_reading(r)
    r["verdict"] = "left open"
    assert "neither" in mechanism_reading(r)

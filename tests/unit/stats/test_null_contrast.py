"""A statistic against its null's distribution (qkplast.stats.nulls.null_contrast): the contrast is taken from the
null's mean, not zero, and its interval carries the null's spread."""

import numpy as np
import pytest

from qkplast.stats.decision import verdict
from qkplast.stats.nulls import null_contrast


def test_the_contrast_is_against_the_nulls_mean_with_its_spread(rng):
    null = rng.normal(-0.02, 0.01, 4000)  # a null whose mean is not 0
    c = null_contrast(-0.03, -0.035, -0.025, null)
    assert c["contrast"] == pytest.approx(-0.03 - null.mean())
    assert c["null_lo"] == pytest.approx(np.quantile(null, 0.025)) and c["null_hi"] == pytest.approx(np.quantile(null, 0.975))
    assert c["lo"] == pytest.approx(-0.035 - c["null_hi"]) and c["hi"] == pytest.approx(-0.025 - c["null_lo"])
    # below 0 by a point estimate, but the interval overlaps the null's range: not decided
    assert c["contrast"] < 0 and c["lo"] < 0 < c["hi"] and verdict(c["contrast"], c["lo"], c["hi"], claim="less") == "left open"
    # an interval wholly below the null's lower quantile decides; against 0 alone the first would have too
    far = null_contrast(-0.08, -0.09, -0.07, null)
    assert verdict(far["contrast"], far["lo"], far["hi"], claim="less") == "supported"
    assert verdict(-0.03, -0.035, -0.025, claim="less") == "supported"  # what testing T < 0 would have said
    assert null_contrast(0.0, -0.01, 0.01, null, null_mean=-0.5)["contrast"] == pytest.approx(0.5)
    narrow = null_contrast(-0.03, -0.035, -0.025, null, level=0.5)
    assert narrow["hi"] - narrow["lo"] < c["hi"] - c["lo"]

"""The policy's interval by quantity: AP_drop from 8 documents on takes the plain jackknife-t, because the committed
coverage table (data/coverage.csv) shows the bias-corrected one under the coverage target there and the plain one
above it in both planted worlds; the test reads the table, so it fails when a regenerated table stops supporting it."""

import numpy as np
import pandas as pd
import pytest

from qkplast.stats.intervals import (COVERAGE_TARGET, JACKKNIFE_BELOW, PLAIN_FROM_JACKKNIFE_BELOW, interval_policy,
                                     jackknife_t, policy_interval)
from tests.helpers import ROOT

TABLE = ROOT / "data" / "coverage.csv"
#: the bench's names of the two candidates, on the range's scale (the policy's) and on the original scale
CANDIDATES = {"range's scale": ("jackknife-t", "bias-corrected jackknife-t"),
              "original scale": ("jackknife-t (unbounded)", "bias-corrected jackknife-t (unbounded)")}


def test_the_policy_differs_only_for_the_named_quantities_and_only_from_eight_units():
    assert interval_policy(16, "ap_drop") == "jackknife" and interval_policy(JACKKNIFE_BELOW, "ap_drop") == "jackknife"
    assert interval_policy(4, "ap_drop") == "jackknife_bc2" and interval_policy(2, "ap_drop") == "jackknife_bc"
    assert interval_policy(16, "ap_overall") == interval_policy(16) == "jackknife_bc"


def _coverage(quantity: str, method: str) -> pd.DataFrame:
    t = pd.read_csv(TABLE)
    return t[(t.quantity == quantity) & (t.method == method) & (t.docs >= JACKKNIFE_BELOW)]


@pytest.mark.parametrize("scale", sorted(CANDIDATES))
@pytest.mark.parametrize("quantity", sorted(PLAIN_FROM_JACKKNIFE_BELOW))
def test_the_committed_coverage_table_supports_the_choice(quantity, scale):
    """From 8 documents on, the plain interval covers within two binomial standard errors of the target in every
    world and document count, the bias-corrected one falls below the target somewhere, and the plain one's worst
    cell is better than the corrected one's: on the range's scale (the policy's intervals) and on the original
    scale (an earlier, larger run)."""
    plain, corrected = (_coverage(quantity, m) for m in CANDIDATES[scale])
    assert len(plain) >= 4 and len(corrected) == len(plain), "the table lacks the rows at 8 and 16 documents"
    se = np.sqrt(COVERAGE_TARGET * (1 - COVERAGE_TARGET) / plain.replicates)
    assert np.all(plain.coverage + 2 * se >= COVERAGE_TARGET), plain[["world", "docs", "coverage"]]
    assert np.any(corrected.coverage < COVERAGE_TARGET), corrected[["world", "docs", "coverage"]]
    assert plain.coverage.min() > corrected.coverage.min()


def test_policy_interval_takes_each_quantitys_method_elementwise(rng):
    jack = rng.normal(0.1, 0.02, size=(16, 3))  # [unit, quantity]
    est = jack.mean(0) + 0.01
    names = ["ap_overall", "ap_drop", "ap_last20"]
    out = policy_interval(est, jack, quantity=names)
    plain, corrected = jackknife_t(est, jack), jackknife_t(est, jack, bias_correct=True)
    np.testing.assert_allclose(out["lo"], [corrected["lo"][0], plain["lo"][1], corrected["lo"][2]])
    np.testing.assert_allclose(out["estimate"], [corrected["estimate"][0], est[1], corrected["estimate"][2]])
    assert list(out["interval"]) == ["jackknife_bc", "jackknife", "jackknife_bc"]
    same = policy_interval(est, jack, quantity=["ap_overall", "ap_last20", "ap_first20"])
    assert same["interval"] == "jackknife_bc"
    bounded = policy_interval(est, jack, quantity=names, bounds=(-1.0, 1.0))
    assert np.all((bounded["lo"] >= -1) & (bounded["hi"] <= 1))

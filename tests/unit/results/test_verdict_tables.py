"""The tables of chapters 07 and 13 in qkplast.results.tables: the coverage summary, the decomposition with its
interval over documents (the verdicts' rule: tests/unit/stats/test_holm_verdicts.py; chapter 13's other tables:
test_extra_metrics_tables.py)."""

import warnings

import numpy as np
import pandas as pd
import pytest

from qkplast.stats.bootstrap import metric_bounds

from qkplast.analysis.metrics import analyze
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.results import tables
from qkplast.theory.planted import planted_capture


def test_coverage_summary_reports_the_policys_lowest_coverage():
    rows = []
    for q, cover in (("ap_overall", 0.94), ("bias_strength", 0.96)):
        for method, c in (("policy", cover), ("BCa", 0.5)):
            rows.append({"world": "w", "docs": 4, "quantity": q, "method": method, "coverage": c, "replicates": 500})
    rows.append({"world": "w", "docs": 4, "quantity": "ap_drop_bias (parts)",
                 "method": "policy (re-analysed)", "coverage": 0.935, "replicates": 500})
    rows.append({"world": "w", "docs": 4, "quantity": "ap_drop_bias (parts)",  # not the policy: left out of the minimum
                 "method": "jackknife-t (re-analysed)", "coverage": 0.90, "replicates": 500})
    rows.append({"world": "w", "docs": 8, "quantity": "ap_overall", "method": "policy", "coverage": 0.90, "replicates": 500})
    table = pd.DataFrame(rows)
    table["coverage_se"] = np.sqrt(table.coverage * (1 - table.coverage) / table.replicates)
    summary = tables.coverage_summary(table, 4)
    assert summary.attrs["policy_min"] == pytest.approx(0.935) and "ap_drop_bias" in summary.attrs["policy_min_at"]
    assert summary.attrs["policy_min_se"] == pytest.approx(np.sqrt(0.935 * 0.065 / 500))
    assert list(summary.columns) == [4, 8] and summary.attrs["replicates"] == 500 and summary.attrs["docs"] == [4, 8]


@pytest.fixture(scope="module")
def planted():
    cap, _ = planted_capture(n_heads=18, dim=8, n_docs=5, samples_per_bucket=6, seed=2, doc_effect=0.3, world_seed=3)
    k = cap.k.values.copy()  # heads of a GQA group share their keys, as in a capture
    group = cap.layer.values * 100 + cap.kv_head.values
    for g in np.unique(group):
        idx = np.flatnonzero(group == g)
        k[idx] = k[idx[0]]
    cap = cap.assign(k=(cap.k.dims, k))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        return cap, analyze(cap, set_sizes=(2,), n_pairs=64)


def test_decomposition_table_with_an_interval_over_documents(planted):
    cap, metrics = planted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        t = tables.decomposition_table(cap, metrics, None)
    assert list(t.index) == ["ap_drop", "ap_drop_baseline", "ap_drop_bias", "ap_drop_content", "ap_drop_interaction"]
    assert t.loc["ap_drop", "mean over heads"] == pytest.approx(t.loc[t.index[1:], "mean over heads"].sum())
    assert (t["95% lo"] <= t["bias-corrected"]).all() and (t["bias-corrected"] <= t["95% hi"]).all()
    assert "5 documents" in t.attrs["method"]
    lo, hi = metric_bounds(list(t.index))  # each part's range: the interval is computed on its scale, never outside
    assert np.all((t["95% lo"].values > lo) & (t["95% hi"].values < hi))

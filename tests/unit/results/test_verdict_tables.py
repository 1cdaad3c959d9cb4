"""The verdict tables of chapters 07 and 13 (qkplast.results.tables): the decision rule with Holm, the coverage
summary, the decomposition with its interval over documents, the GQA table with both nulls."""

import warnings

import numpy as np
import pandas as pd
import pytest

from qkplast.analysis.metrics import analyze
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.options import AnalysisOptions
from qkplast.results import tables
from qkplast.theory.planted import planted_capture


def test_corrections_verdicts_apply_holm_and_the_interval():
    readings = [
        {"item": "a", "p": 0.001},
        {"item": "b", "p": 0.03},  # passes as the largest of 4, not as the second largest of 5
        {"item": "c", "p": 0.004, "estimate": 0.3, "lo": 0.1, "hi": 0.5, "claim": "greater"},
        {"item": "d", "p": 0.004, "estimate": -0.3, "lo": -0.5, "hi": 0.1, "claim": "less"},  # interval across 0
    ]
    out = tables.corrections_verdicts(readings)
    np.testing.assert_allclose(out["p (Holm)"], [0.004, 0.03, 0.012, 0.012])
    assert list(out.verdict) == ["confirmed", "confirmed", "confirmed", "left open"]
    out = tables.corrections_verdicts(readings + [{"item": "e", "p": 0.5}])
    assert out.loc["b", "verdict"] == "not distinguishable from the null"  # 0.03 x 2 after the step-down
    assert "Holm across 5" in out.attrs["rule"]
    out = tables.corrections_verdicts(readings + [{"item": "f", "p": np.nan}])  # undefined on this capture
    assert out.loc["f", "verdict"] == "left open" and np.isnan(out.loc["f", "p (Holm)"])
    np.testing.assert_allclose(out["p (Holm)"].iloc[:4], [0.004, 0.03, 0.012, 0.012])  # m counts 4, not 5
    # an item whose interval is undefined (too few effective documents) is not decided on its p alone
    undefined = {"item": "g", "p": 1e-6, "estimate": 0.3, "lo": np.nan, "hi": np.nan, "claim": "greater"}
    out = tables.corrections_verdicts(readings + [undefined])
    assert out.loc["g", "verdict"] == "left open" and out.loc["a", "verdict"] == "confirmed"


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


def test_gqa_table_has_both_nulls_and_an_interval(planted):
    cap, metrics = planted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        g = tables.gqa_table(cap, metrics, AnalysisOptions(n_pairs=64), n_perm=99)
    row = g.iloc[0]
    assert row["95% lo"] <= row["95% hi"] and 0 < row["p (labels permuted)"] <= 1 and 0 < row["p (keys kept)"] <= 1
    assert row["within group"] - row["between groups"] == pytest.approx(row["T"])


def test_listwise_intervals_leave_the_correlation_open_with_too_few_heads():
    """Two heads cannot rank: rho and its permutation p are NaN (a tiny model), the means still get intervals."""
    cap, _ = planted_capture(n_heads=2, dim=8, n_docs=4, samples_per_bucket=6, seed=4, doc_effect=0.3, world_seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        metrics = analyze(cap, set_sizes=(2, 8), n_pairs=32)
        t = tables.listwise_document_intervals(cap, metrics, n_perm=19)
    assert np.isnan(t.loc[8, "rho"]) and np.isnan(t.loc[8, "p_perm"])
    assert np.isfinite(t.loc[2, "model"]) and "4 documents" in t.attrs["method"]


def test_the_correlations_interval_stays_inside_minus_one_one(planted, monkeypatch):
    """rho's jackknife-t runs on Fisher's z and maps back: with leave-out correlations this spread near 1, an
    interval on rho's own scale would pass 1."""
    cap, _ = planted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        metrics = analyze(cap, set_sizes=(2, 8), n_pairs=32)
    means = {(m, name): 0.5 for m in (2, 8) for name in ("ap_set", "ap_set_mc")}
    # the whole capture's, each left-out document's, then each left-out pair's (5 documents: the policy's second level)
    rhos = iter([0.95, 0.99, 0.3, 0.98, 0.97, 0.2, 0.99, 0.4, 0.97, 0.96, 0.35, 0.98, 0.97, 0.25, 0.3, 0.96])
    monkeypatch.setattr(tables, "listwise", lambda capture, options: None)
    monkeypatch.setattr(tables, "listwise_means", lambda lw: {**means, (8, "rho"): next(rhos)})
    monkeypatch.setattr(tables, "pairwise_predicts_listwise", lambda *a, **k: {"p_perm": 0.5})
    t = tables.listwise_document_intervals(cap, metrics, n_perm=19)
    lo, hi = (float(x) for x in t.loc[8, "rho 95% CI"].strip("[]").split(","))
    assert -1.0 <= lo <= hi <= 1.0 and t.loc[8, "rho"] == pytest.approx(0.95)

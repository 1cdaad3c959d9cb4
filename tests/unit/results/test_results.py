"""Results tables: this project's numbers beside the thesis's, computed from the metrics and the reference data."""

import warnings

import numpy as np
import pytest
from scipy import stats

import qkplast
from qkplast.results import reference
from qkplast.results import tables as results
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.stats.decision import null_verdict
from qkplast.theory.planted import planted_capture


@pytest.fixture(scope="module")
def metrics():
    cap, _ = planted_capture(n_heads=12, dim=8, seq_len=2048, bucket_size=128, n_docs=8, samples_per_bucket=2, seed=4)
    cap = cap.assign_coords(layer=("head", np.arange(12) // 3), q_head=("head", np.arange(12) % 3),
                            kv_head=("head", np.arange(12) % 3 // 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        return qkplast.analyze(cap, n_pairs=32)


def test_geometry_table_values_and_differences(metrics):
    t = results.geometry_table(metrics)
    assert t.loc["mean |r_k| on axis a", "this run"] == pytest.approx(float(abs(metrics.r_k_a).mean()), abs=1e-3)
    assert t.loc["mean |r_k| on axis a", "thesis"] == "0.87"
    want = float(abs(metrics.r_k_a).mean()) - 0.87
    assert float(t.loc["mean |r_k| on axis a", "difference"]) == pytest.approx(want, abs=1e-3)
    assert t.loc["{a, b} plane share of variance (%)", "thesis"] == "30-43"
    shares = [t.loc[f"{n} heads (%)", "this run"] for n in ("position-dominated", "Q-positional", "content-focused", "mixed")]
    assert sum(shares) == pytest.approx(100, abs=0.01)
    assert "different setting" in t.attrs["comparability"]


def test_quintile_table_has_this_run_and_table_6_1(metrics):
    t = results.quintile_table({"planted": metrics})
    assert t.shape == (12, 6)
    ours = t.iloc[0]
    np.testing.assert_allclose(ours.iloc[:5], metrics.ap_context.mean("head"), atol=5e-4)
    thesis = reference.load("quintile_plasticity")
    q3b = t.xs("Qwen-3-4B", level="model").iloc[0]
    np.testing.assert_allclose(q3b.iloc[:5], thesis[thesis.model == "Qwen-3-4B"].sort_values("quintile").ap)
    with pytest.raises(ValueError, match="context_bins"):
        results.quintile_table({"x": metrics.isel(context_bin=[0, 1])})


def test_benchmark_correlations_recomputed_from_table_6_3():
    c = results.benchmark_correlations()
    lb = reference.load("longbench_matched")
    assert c.loc["ap_drop", "pearson_r"] == pytest.approx(stats.pearsonr(lb.ap_drop, lb.lbp_score)[0], abs=1e-3)
    assert c.loc["ap_drop", "spearman_rho"] == pytest.approx(stats.spearmanr(lb.ap_drop, lb.lbp_score)[0], abs=1e-3)
    assert (c.models == 7).all() and c.loc["ap_drop", "pearson_r"] < 0


def test_gaussian_agreement_and_bias_bands(metrics):
    g = results.gaussian_agreement(metrics)
    assert 0 not in g.index  # bucket 0 has no pairs
    assert ((g["heads within 0.05"] >= 0) & (g["heads within 0.05"] <= 1)).all()
    diffs = np.nanmean(np.abs(metrics.ap - metrics.ap_mc).values[:, 5])
    assert g.loc[5, "mean |difference|"] == pytest.approx(diffs, abs=1e-3)
    bands = results.bias_by_layer_band(metrics, n_bands=2)
    r = np.corrcoef(metrics.separation_strength, metrics.bias_strength)[0, 1]
    assert bands.pearson_r.iloc[0] == pytest.approx(r, abs=1e-3) and bands.heads.iloc[1:].sum() == 12


def test_thesis_tables():
    lc = results.thesis_lc_positions()
    assert lc.shape == (4, 8) and lc.loc["LC 32K→64K 20K", "48K–64K"] == 0.430
    t = results.thesis_trajectory()
    assert len(t) == 10 and t.loc["stg3 4.72M", "bias_str"] == 0.0194


def test_trajectory_table_and_corpus_comparison(metrics):
    t = results.trajectory_table({"a": metrics, "b": metrics})
    assert list(t.index) == ["a", "b"] and t.loc["a", "AP_drop"] == pytest.approx(float(metrics.ap_drop.mean()))
    from qkplast.stats.bootstrap import bootstrap

    cap, _ = planted_capture(n_heads=2, dim=8, seq_len=1024, bucket_size=128, n_docs=6, samples_per_bucket=2, seed=1)
    b = bootstrap(cap, n_boot=3, n_pairs=16)
    c = results.corpus_comparison({"x": metrics, "y": metrics}, {"x": b, "y": b})
    assert (c["x"] == c["y"]).all() and c.loc["ap_drop basic interval", "x"].startswith("[")
    assert c.loc["ap_drop policy (two-level bias-corrected jackknife-t) interval", "x"].startswith("[")
    w = results.with_intervals(b)
    assert "95% basic" in w.columns and "95% percentile" in w.columns
    assert "95% policy (two-level bias-corrected jackknife-t)" in w.columns
    lo, hi = float(b.lo_basic.sel(metric="ap_drop")), float(b.hi_basic.sel(metric="ap_drop"))
    assert w.loc["ap_drop", "95% basic"] == f"[{lo:.3g}, {hi:.3g}]"
    lo, hi = float(b.lo.sel(metric="ap_drop")), float(b.hi.sel(metric="ap_drop"))
    assert w.loc["ap_drop", "95% policy (two-level bias-corrected jackknife-t)"] == f"[{lo:.3g}, {hi:.3g}]"
    assert "3 replicates" in w.attrs["note"] and "6 documents" in w.attrs["note"]
    if "lo_bca" in b:
        assert "95% BCa" in w.columns and c.loc["ap_drop BCa interval", "x"].startswith("[")


def test_bias_share_quantiles_and_signs():
    import xarray as xr
    bias = np.array([1.0, 2.0, -1.0, 0.0, 4.0])
    full = np.array([2.0, 3.0, -2.0, 5.0, -4.0])
    m = xr.Dataset({"bias_strength": ("head", bias), "key_position_slope": ("head", full)})
    s = results.bias_share(m)
    ratio = np.array([2.0, 1.5, 2.0, -1.0])  # the head with bias 0 is left out
    assert s["heads"] == 4
    assert s["ratio, median"] == pytest.approx(np.median(ratio))
    assert s["ratio, 5% quantile"] == pytest.approx(np.quantile(ratio, 0.05))
    assert s["heads with the same sign"] == pytest.approx(0.75)
    assert s["share of the slope on axis a (median)"] == pytest.approx(np.median(1 / ratio))
    with pytest.raises(ValueError, match="non-zero"):
        results.bias_share(m.assign(bias_strength=("head", np.zeros(5))))


def test_edge_buckets_follow_the_options(metrics):
    e = results.edge_buckets(metrics)
    # 16 buckets of 128 in 2048 tokens, midpoints (j + 1/2) 128: tau/L < 0.2 for j <= 2, >= 0.8 for j >= 13;
    # bucket 0 has no earlier keys
    assert e.loc["first", "buckets"] == [0, 1, 2] and e.loc["first", "buckets with plasticity"] == [1, 2]
    assert e.loc["last", "buckets with plasticity"] == [13, 14, 15]
    assert (e["n averaged"].to_list()) == [2, 3]
    by_index = results.edge_buckets(metrics, qkplast.AnalysisOptions(edge_rule="bucket_index"))
    assert by_index.loc["first", "buckets"] == [0, 1, 2, 3] and by_index.loc["last", "n averaged"] == 4


def test_null_verdict_wording_follows_the_comparison():
    rng = np.random.default_rng(0)
    null = rng.normal(0, 1, 999)
    strong = null_verdict(4.0, null, null_name="shuffle")
    assert strong["confirmed"] and strong["word"] == "confirmed" and strong["p"] == pytest.approx(1 / 1000)
    assert "shuffle (999 replicates)" in strong["text"] and "before any correction" in strong["text"]
    assert "confirmed" not in strong["text"]  # the word is decided with the page's correction, not in the line
    weak = null_verdict(0.5, null)
    assert not weak["confirmed"] and weak["word"] == "not distinguishable from the null"
    assert weak["p"] == pytest.approx((1 + (null >= 0.5).sum()) / 1000)
    assert null_verdict(-4.0, null, alternative="less")["confirmed"]
    with pytest.raises(ValueError, match="empty"):
        null_verdict(1.0, [])
    undefined = null_verdict(1.0, [np.nan, np.nan])  # a statistic undefined on this capture: said, not raised
    assert np.isnan(undefined["p"]) and undefined["word"] == "left open" and "undefined" in undefined["text"]
    assert np.isnan(null_verdict(np.nan, null)["p"])

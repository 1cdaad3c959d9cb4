"""Results against the thesis: this project's runs beside the numbers of chapter 6.

Every table here puts a quantity measured on a run next to the thesis's value
for the same quantity (from :mod:`qkplast.results.reference`), with the difference and a
statement of whether the two are comparable and, if not, why.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import xarray as xr

from qkplast.options import AnalysisOptions
from qkplast.results import reference

#: (label, thesis fact name in scalar_facts.csv, function of the metrics, scale to the fact's unit)
GEOMETRY = (
    ("PC0 share of pooled variance (%)", "pca_pc0_variance_share", lambda m: m.explained_variance_ratio[:, 0].mean(), 100),
    ("PC1 share of pooled variance (%)", "pca_pc1_variance_share", lambda m: m.explained_variance_ratio[:, 1].mean(), 100),
    ("mean |r_q| on PC0", "pc0_abs_r_q", lambda m: abs(m.r_q_pc[:, 0]).mean(), 1),
    ("mean |r_k| on PC0", "pc0_abs_r_k", lambda m: abs(m.r_k_pc[:, 0]).mean(), 1),
    ("mean |r_q| on axis a", "drift_axis_abs_r_q", lambda m: abs(m.r_q_a).mean(), 1),
    ("mean |r_k| on axis a", "drift_axis_abs_r_k", lambda m: abs(m.r_k_a).mean(), 1),
    ("{a, b} plane share of variance (%)", "ab_plane_variance_share", lambda m: m.plane_variance_fraction.mean(), 100),
    ("heads with positive bias_strength (%)", "positive_bias_strength_share", lambda m: (m.bias_strength > 0).mean(), 100),
    ("position-dominated heads (%)", "taxonomy_position_dominated", lambda m: (m.taxonomy == "position-dominated").mean(), 100),
    ("Q-positional heads (%)", "taxonomy_q_positional", lambda m: (m.taxonomy == "q-positional").mean(), 100),
    ("content-focused heads (%)", "taxonomy_content_focused", lambda m: (m.taxonomy == "content-focused").mean(), 100),
    ("mixed heads (%)", "taxonomy_mixed", lambda m: (m.taxonomy == "mixed").mean(), 100),
)

NOT_SAME_SETTING = ("thesis: 11 models (0.6B-14B) on 128K-token LongBench-Pro documents; this run: {model} on "
                    "{seq_len}-token windows of {corpus}")


def _thesis_value(name: str) -> tuple[float, float, float]:
    """(value, low, high) of a scalar fact; a range has value NaN, a point has low = high = value."""
    lo, hi = reference.scalar_range(name)
    try:
        value = reference.scalar(name)
    except ValueError:
        value = float("nan")
    return value, lo, hi


def _difference(ours: float, value: float, lo: float, hi: float) -> str:
    if not math.isnan(value):
        return f"{ours - value:+.3g}"
    if lo <= ours <= hi:
        return "inside the range"
    return f"{ours - (lo if ours < lo else hi):+.3g} outside the range"


def _setting(metrics: xr.Dataset) -> str:
    cap = metrics.attrs.get("capture", {})
    return NOT_SAME_SETTING.format(model=cap.get("model"), seq_len=cap.get("seq_len"), corpus=cap.get("corpus"))


def geometry_table(metrics: xr.Dataset) -> pd.DataFrame:
    """Section 6.1's quantities: the thesis's pooled value, this run's, and their difference."""
    rows = []
    for label, fact, fn, scale in GEOMETRY:
        value, lo, hi = _thesis_value(fact)
        ours = float(fn(metrics)) * scale
        thesis = f"{value:g}" if not math.isnan(value) else f"{lo:g}-{hi:g}"
        rows.append({"quantity": label, "thesis": thesis, "this run": round(ours, 3),
                     "difference": _difference(ours, value, lo, hi)})
    table = pd.DataFrame(rows).set_index("quantity")
    table.attrs["comparability"] = ("same quantities and definitions, different setting (" + _setting(metrics)
                                    + "): the comparison is of kind, not of value")
    return table


def bias_share(metrics: xr.Dataset, quantiles=(0.05, 0.5, 0.95)) -> pd.Series:
    """How much of the linear key-position preference ``mu_Q^T beta_K`` the drift axis carries.

    ``key_position_slope / bias_strength`` per head (the full slope over
    key position of the mean query's score against eq. 4.6's drift-axis part;
    see the rotation page): its quantiles over heads, the median share
    ``bias_strength / key_position_slope`` and how often the two have the
    same sign. Heads where either is exactly 0 are left out.
    """
    full, bias = metrics.key_position_slope.values, metrics.bias_strength.values
    ok = (full != 0) & (bias != 0) & np.isfinite(full) & np.isfinite(bias)
    if not ok.any():
        raise ValueError("no head has a non-zero bias_strength and key_position_slope: nothing to compare")
    ratio = full[ok] / bias[ok]
    out = {f"ratio, {int(100 * q)}% quantile" if q != 0.5 else "ratio, median": float(np.quantile(ratio, q))
           for q in quantiles}
    out["share of the slope on axis a (median)"] = float(np.median(bias[ok] / full[ok]))
    out["heads with the same sign"] = float(np.mean(np.sign(full[ok]) == np.sign(bias[ok])))
    out["heads"] = int(ok.sum())
    return pd.Series(out, name="key_position_slope / bias_strength")


def edge_buckets(metrics: xr.Dataset, options=None) -> pd.DataFrame:
    """Which query buckets ``ap_first20`` and ``ap_last20`` average, under the run's options.

    One row per edge (``first``, ``last``): the rule, the bucket indices in it,
    those with plasticity defined for some head (bucket 0 has no earlier keys),
    and their count. The two aggregates generally average different numbers of
    buckets (with 16 buckets and the midpoint rule: 2 usable against 3), so their
    sampling noise differs too.
    """
    from qkplast.analysis.plasticity import edge_masks

    opt = AnalysisOptions.from_kwargs(options, **metrics.attrs.get("options", {})) if options is None else options
    seq_len = int(metrics.attrs.get("capture", {}).get("seq_len", 0) or metrics.attrs.get("seq_len"))
    tau = metrics.tau.values.astype(float)
    first, last = edge_masks(tau, seq_len, opt)
    defined = ~np.isnan(metrics.ap.values).all(0)
    rule = (f"tau / seq_len < {opt.edge_fraction:g} (first), >= {1 - opt.edge_fraction:g} (last)"
            if opt.edge_rule == "position" else f"first/last ceil({opt.edge_fraction:g} x {len(tau)}) buckets")
    rows = []
    for name, mask in (("first", first), ("last", last)):
        idx = metrics.query_bucket.values[mask]
        use = metrics.query_bucket.values[mask & defined]
        rows.append({"edge": name, "rule": rule, "buckets": idx.tolist(), "buckets with plasticity": use.tolist(),
                     "n averaged": int(len(use))})
    return pd.DataFrame(rows).set_index("edge")


def bias_by_layer_band(metrics: xr.Dataset, n_bands: int = 3) -> pd.DataFrame:
    """Pooled and within-group correlation of bias_strength with separation_strength.

    The thesis's Simpson's paradox (section 6.1.2: +0.48 pooled, -0.65 within Llama) needs several
    families; a single model has one, so the groups here are bands of layers, the analogue within one
    model: a pooled correlation can hide within-band ones of the other sign.
    """
    from scipy import stats  # here, not at the top: the tables that only read a run's metrics need no scipy

    layer = metrics.layer.values
    edges = np.quantile(layer, np.linspace(0, 1, n_bands + 1))
    band = np.clip(np.searchsorted(edges, layer, side="right") - 1, 0, n_bands - 1)
    x, y = metrics.separation_strength.values, metrics.bias_strength.values
    rows = [{"group": "all heads (pooled)", "heads": len(x), "pearson_r": stats.pearsonr(x, y)[0]}]
    for b in range(n_bands):
        sel = band == b
        if sel.sum() > 2:
            rows.append({"group": f"layers {layer[sel].min()}-{layer[sel].max()}", "heads": int(sel.sum()),
                         "pearson_r": stats.pearsonr(x[sel], y[sel])[0]})
    return pd.DataFrame(rows).set_index("group").round(3)


def quintile_table(metrics_by_run: dict[str, xr.Dataset], include_thesis: bool = True) -> pd.DataFrame:
    """Mean plasticity per fifth of the context and AP_drop, in the layout of Table 6.1."""
    cols = ["0-20%", "20-40%", "40-60%", "60-80%", "80-100%"]
    rows = {}
    for name, m in metrics_by_run.items():
        if m.sizes["context_bin"] != 5:
            raise ValueError(f"run {name!r} was analysed with context_bins={m.sizes['context_bin']}, not 5")
        prof = m.ap_context.mean("head").values
        rows[(f"this project ({m.attrs['capture']['corpus']})", name)] = [*prof, float(m.ap_drop.mean())]
    if include_thesis:
        q = reference.load("quintile_plasticity")
        for (family, model), g in q.groupby(["family", "model"], sort=False):
            g = g.sort_values("quintile")
            rows[(f"thesis: {family}", model)] = [*g.ap.values, float(g.ap_drop.iloc[0])]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=[*cols, "AP_drop"])
    table.index = pd.MultiIndex.from_tuples(table.index, names=["group", "model"])
    return table.round(3)


#: interval columns of a bootstrap Dataset beside the policy's ``lo``/``hi``: (label, low variable, high variable)
INTERVALS = (("basic", "lo_basic", "hi_basic"), ("percentile", "lo_percentile", "hi_percentile"),
             ("BCa", "lo_bca", "hi_bca"), ("jackknife-t", "lo_jackknife_t", "hi_jackknife_t"))


def _interval_words(name: str) -> str:
    """How pages print an interval method's name (:data:`qkplast.stats.schema.INTERVAL_NAMES`)."""
    from qkplast.stats.schema import INTERVAL_NAMES

    return INTERVAL_NAMES.get(name, name)


def _policy_label(boot: xr.Dataset) -> str:
    return f"policy ({_interval_words(boot.attrs.get('interval', '?'))})"


def with_intervals(boot: xr.Dataset, digits: int = 3) -> pd.DataFrame:
    """Estimate, the policy's interval (``lo``/``hi``) and every other interval per metric, as printed.

    ``attrs["note"]`` states the replicate count, the number of documents and the method.
    """
    level = int(round(100 * boot.attrs["level"]))
    out = pd.DataFrame({"estimate": boot.estimate.values}, index=boot.metric.values)
    out[f"{level}% {_policy_label(boot)}"] = [f"[{a:.{digits}g}, {b:.{digits}g}]"
                                              for a, b in zip(boot["lo"].values, boot["hi"].values)]
    for label, lo, hi in INTERVALS:
        if lo in boot and hi in boot:
            out[f"{level}% {label}"] = [f"[{a:.{digits}g}, {b:.{digits}g}]" for a, b in zip(boot[lo].values, boot[hi].values)]
    out["bootstrap se"] = boot.se.values
    out["replicate bias"] = boot.bias.values
    method = boot.attrs.get("method")
    out.attrs["note"] = (f"{boot.attrs['n_docs']} documents; {method}" if method else
                         f"{boot.attrs['n_boot']} replicates over {boot.attrs['n_docs']} documents; basic and "
                         f"percentile intervals")
    return out


def gaussian_agreement(metrics: xr.Dataset) -> pd.DataFrame:
    """Per query bucket: how closely the Gaussian closed form tracks the Monte Carlo plasticity over heads."""
    rows = []
    for b in metrics.query_bucket.values:
        a, m = metrics.ap.sel(query_bucket=b).values, metrics.ap_mc.sel(query_bucket=b).values
        ok = ~np.isnan(a) & ~np.isnan(m)
        if ok.sum() < 3:
            continue
        rows.append({"query_bucket": int(b), "tau": float(metrics.tau.sel(query_bucket=b)),
                     "mean closed form": a[ok].mean(), "mean Monte Carlo": m[ok].mean(),
                     "mean |difference|": np.abs(a[ok] - m[ok]).mean(),
                     "heads within 0.05": (np.abs(a[ok] - m[ok]) < 0.05).mean(),
                     "correlation over heads": np.corrcoef(a[ok], m[ok])[0, 1]})
    return pd.DataFrame(rows).set_index("query_bucket").round(3)


def corpus_comparison(runs: dict[str, xr.Dataset], boots: dict[str, xr.Dataset] | None = None) -> pd.DataFrame:
    """The same model and analysis on different corpora, side by side (thesis 7.5: untested there)."""
    from qkplast.results.summary import summarize

    table = pd.DataFrame({name: summarize(m) for name, m in runs.items()}).round(4).astype(object)
    if boots:
        for name, b in boots.items():
            for metric in ("ap_first20", "ap_last20", "ap_drop"):
                i = list(b.metric.values).index(metric)
                table.loc[f"{metric} {_policy_label(b)} interval", name] = f"[{b['lo'].values[i]:.3f}, {b['hi'].values[i]:.3f}]"
                for label, lo, hi in INTERVALS:
                    if lo in b:
                        table.loc[f"{metric} {label} interval", name] = f"[{b[lo].values[i]:.3f}, {b[hi].values[i]:.3f}]"
    return table


def trajectory_table(metrics_by_checkpoint: dict[str, xr.Dataset]) -> pd.DataFrame:
    """Table 6.2's columns for a list of checkpoints, in the given order."""
    rows = {}
    for name, m in metrics_by_checkpoint.items():
        rows[name] = {"bias_str": float(m.bias_strength.mean()), "|alpha_K|": float(abs(m.alpha_k).mean()),
                      "|r_k^(a)|": float(abs(m.r_k_a).mean()), "AP_overall": float(m.ap_overall.mean()),
                      "AP_first20": float(m.ap_first20.mean()), "AP_drop": float(m.ap_drop.mean())}
    return pd.DataFrame.from_dict(rows, orient="index")


def thesis_trajectory() -> pd.DataFrame:
    """Table 6.2 of the thesis (SmolLM3-3B checkpoints), from the reference data."""
    t = reference.load("smollm3_trajectory").set_index("label")
    return t[["phase", "bias_strength", "alpha_k_abs", "r_k_a_abs", "ap_overall", "ap_first20", "ap_drop"]].rename(
        columns={"bias_strength": "bias_str", "alpha_k_abs": "|alpha_K|", "r_k_a_abs": "|r_k^(a)|",
                 "ap_overall": "AP_overall", "ap_first20": "AP_first20", "ap_drop": "AP_drop"})


def benchmark_correlations() -> pd.DataFrame:
    """Pearson and Spearman correlations of plasticity metrics with LongBench-Pro (Table 6.3, 7 models)."""
    from scipy import stats

    lb = reference.load("longbench_matched")
    rows = []
    for metric in ("ap_drop", "ap_last20", "ap_first20", "ap_overall"):
        pr, pp = stats.pearsonr(lb[metric], lb.lbp_score)
        sr, sp = stats.spearmanr(lb[metric], lb.lbp_score)
        rows.append({"metric": metric, "pearson_r": pr, "pearson_p": pp, "spearman_rho": sr, "spearman_p": sp,
                     "models": len(lb)})
    return pd.DataFrame(rows).set_index("metric").round(3)


def thesis_lc_positions() -> pd.DataFrame:
    """Table A.1 (SmolLM3-3B long-context phases): plasticity per position bin, one row per checkpoint."""
    lc = reference.load("smollm3_lc_per_position")
    table = lc.pivot_table(index="label", columns="bin", values="ap", sort=False)
    labels = lc.drop_duplicates("bin").set_index("bin").bin_label
    return table.rename(columns=labels.to_dict()).rename_axis(index="checkpoint", columns="positions")


# --------------------------------------------------------------------------- tables of inference made in qkplast.stats


def decomposition_table(capture: xr.Dataset, metrics: xr.Dataset, options=None, level: float = 0.95, *,
                        store=None) -> pd.DataFrame:
    """AP_drop and its four parts (:mod:`qkplast.analysis.decompose`): means over heads with the policy's interval
    over documents (:func:`qkplast.stats.bootstrap.document_interval`: jackknife-t, each document left out and the
    capture re-analysed, on the scale of each part's range, :data:`qkplast.stats.bootstrap.RANGES`, so it never
    leaves it: the interval the coverage table measures as ``policy (re-analysed)``), and the share of heads with a
    positive value. The left-out captures are analysed in one batch
    (:class:`qkplast.analysis.decompose.ModelLevelTerms`); ``store`` (:func:`qkplast.rundir.product_store`) keeps
    their values in the run directory (``decomposition-jackknife``) and reads them back."""
    from qkplast.analysis.decompose import TERMS, ModelLevelTerms
    from qkplast.provenance import product_provenance
    from qkplast.stats.bootstrap import document_interval, metric_bounds
    from qkplast.tensors import resolve_device

    names = ["ap_drop", *TERMS]
    opt = options or AnalysisOptions()
    key = {"statistic": "model_level_terms", "quantities": names, "options": opt.result_key(),
           "provenance": product_provenance("analysis", "stats", "tensors.py", "options.py",
                                            device=str(resolve_device(opt.device)))}
    ci = document_interval(capture, ModelLevelTerms(opt, names), level, pairs_of=opt, bounds=metric_bounds(names),
                           quantity=names, store=store, stem="decomposition-jackknife", key=key)
    out = pd.DataFrame({"mean over heads": ci["point"], "bias-corrected": ci["estimate"], f"{int(100 * level)}% lo": ci["lo"],
                        f"{int(100 * level)}% hi": ci["hi"],
                        "share of heads > 0": [float((metrics[n] > 0).mean()) for n in names]}, index=names)
    kinds = dict.fromkeys(np.atleast_1d(ci["interval"]).astype(str))  # one method, or one per part (by quantity)
    out.attrs["method"] = (f"{' / '.join(_interval_words(k) for k in kinds)} over {len(ci['jackknife'])} documents "
                           f"({len(ci['jackknife']) - 1} degrees of freedom), each left-out capture re-analysed")
    return out


def coverage_results(path=None) -> pd.DataFrame:
    """The stored coverage table of ``benchmarks/bench_coverage.py`` (``data/coverage.csv``)."""
    from pathlib import Path

    from qkplast.resources import resource_dir

    path = Path(path) if path is not None else resource_dir("data") / "coverage.csv"  # the checkout's, or the wheel's
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run python benchmarks/bench_coverage.py to make it")
    return pd.read_csv(path)


#: the coverage table's rows of the policy's interval: the bootstrap's ``lo``/``hi`` for its six quantities, and
#: :func:`qkplast.stats.bootstrap.document_interval` (each left-out capture re-analysed) for the AP_drop parts
POLICY_METHODS = ("policy", "policy (re-analysed)")


def policy_rows(table: pd.DataFrame, unbounded: bool = False) -> pd.DataFrame:
    """The coverage table's rows of the policy's interval as the policy now reads
    (:func:`qkplast.stats.intervals.interval_policy`, by quantity and number of units).

    The rows ``policy`` / ``policy (re-analysed)`` (with ``unbounded``: their ``(unbounded)`` variants), except for a
    quantity of :data:`qkplast.stats.intervals.PLAIN_FROM_JACKKNIFE_BELOW` (its name before any `` (...)`` suffix)
    from ``JACKKNIFE_BELOW`` documents on, whose policy is the plain jackknife-t: its ``jackknife-t`` rows. A table
    measured before the policy took the plain interval for those quantities has them in its ``policy`` rows too;
    this selection reads the interval the policy uses now.
    """
    from qkplast.stats.intervals import JACKKNIFE_BELOW, PLAIN_FROM_JACKKNIFE_BELOW

    methods = ("policy (unbounded)", "policy (re-analysed, unbounded)") if unbounded else POLICY_METHODS
    plain_methods = tuple(m.replace("policy", "jackknife-t", 1) for m in methods)
    base = table.quantity.str.replace(r" \(.*\)$", "", regex=True)
    plain = base.isin(PLAIN_FROM_JACKKNIFE_BELOW) & (table.docs >= JACKKNIFE_BELOW)
    return table[(~plain & table.method.isin(methods)) | (plain & table.method.isin(plain_methods))]


def coverage_summary(table: pd.DataFrame, n_docs: int) -> pd.DataFrame:
    """Coverage of each method at each document count (columns), per world and quantity (rows), as printed;
    and, in ``attrs``, the smallest coverage of the policy's interval at ``n_docs`` documents over every
    world and quantity (``policy_min``, its binomial standard error ``policy_min_se``) and where it occurs,
    the fewest replicates of any cell and the document counts measured."""
    wide = table.pivot_table(index=["world", "quantity", "method"], columns="docs", values="coverage", sort=False)
    policy = policy_rows(table)
    policy = policy[policy.docs == n_docs]
    worst = policy.loc[policy.coverage.idxmin()] if len(policy) else None
    wide.attrs.update(policy_min=float(worst.coverage) if worst is not None else float("nan"),
                      policy_min_se=float(worst.coverage_se) if worst is not None else float("nan"),
                      policy_min_at=f"{worst.world}: {worst.quantity}" if worst is not None else "",
                      replicates=int(table.replicates.min()), docs=sorted(int(d) for d in table.docs.unique()))
    return wide


"""Results against the thesis: this project's runs beside the numbers of chapter 6.

Every table here puts a quantity measured on a run next to the thesis's value
for the same quantity (from :mod:`qkplast.results.reference`), with the difference and a
statement of whether the two are comparable and, if not, why.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import xarray as xr
from scipy import stats

from qkplast.analysis.listwise import listwise, listwise_means, pairwise_predicts_listwise
from qkplast.analysis.plasticity import PlasticityWarning
from qkplast.options import AnalysisOptions
from qkplast.results import reference
from qkplast.stats.intervals import leave_two_out, needs_leave_two_out, policy_interval, t_interval

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
    from qkplast.options import AnalysisOptions
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
    """How pages print an interval method's name (:data:`qkplast.stats.bootstrap.INTERVAL_NAMES`)."""
    from qkplast.stats.bootstrap import INTERVAL_NAMES

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


# --------------------------------------------------------------------------- verdict tables (chapters 07, 12, 13)


def decomposition_table(capture: xr.Dataset, metrics: xr.Dataset, options=None, level: float = 0.95) -> pd.DataFrame:
    """AP_drop and its four parts (:mod:`qkplast.analysis.decompose`): means over heads with the policy's interval
    over documents (jackknife-t, each document left out and the capture re-analysed), and the share of heads
    with a positive value."""
    from qkplast.analysis.decompose import TERMS, model_level_terms
    from qkplast.stats.bootstrap import document_interval

    from qkplast.options import AnalysisOptions

    names = ["ap_drop", *TERMS]
    opt = options or AnalysisOptions()
    ci = document_interval(capture, lambda c, pairs=None: [model_level_terms(c, opt, pairs=pairs)[n] for n in names],
                           level, pairs_of=opt)
    out = pd.DataFrame({"mean over heads": ci["point"], "bias-corrected": ci["estimate"], f"{int(100 * level)}% lo": ci["lo"],
                        f"{int(100 * level)}% hi": ci["hi"],
                        "share of heads > 0": [float((metrics[n] > 0).mean()) for n in names]}, index=names)
    out.attrs["method"] = (f"{_interval_words(ci['interval'])} over {len(ci['jackknife'])} documents "
                           f"({len(ci['jackknife']) - 1} degrees of freedom), each left-out capture re-analysed")
    return out


def gqa_table(capture: xr.Dataset, metrics: xr.Dataset, options=None, n_perm: int = 2000, seed: int = 0,
              level: float = 0.95) -> pd.DataFrame:
    """The GQA coordination statistic ``T`` (:mod:`qkplast.analysis.gqa`) with both nulls and an interval over documents.

    Rows: the closed-form profiles ``ap``. Columns: ``T``, the within-layer label-permutation null (mean,
    p) and the null that keeps every head's keys (:func:`qkplast.analysis.gqa.gqa_key_null`; mean, p), and the
    policy's interval of ``T`` over documents (each left-out capture's closed-form profiles). Groups
    share their keys, so the label null's p counts similarity the keys alone build in; the key null's does not.
    """
    from qkplast.analysis.gqa import cross_profiles, gqa_key_null, gqa_similarity
    from qkplast.analysis.plasticity import closed_form_ap
    from qkplast.options import AnalysisOptions
    from qkplast.stats.bootstrap import document_interval

    opt = AnalysisOptions.from_kwargs(options)
    labels = gqa_similarity(metrics, "ap", n_perm=n_perm, seed=seed)
    keys = gqa_key_null(metrics, cross_profiles(capture, opt), n_perm=n_perm, seed=seed)

    def statistic(cap):
        ap, _ = closed_form_ap(cap, opt)
        return float(gqa_similarity(metrics.assign(ap=(("head", "query_bucket"), ap)), "ap", n_perm=1).statistic)

    ci = document_interval(capture, statistic, level, estimate=float(labels.statistic))
    out = pd.DataFrame({"T": [float(labels.statistic)], f"{int(100 * level)}% lo": [float(ci["lo"])],
                        f"{int(100 * level)}% hi": [float(ci["hi"])], "within group": [float(labels.within)],
                        "between groups": [float(labels.between)], "label null mean": [float(labels.null_mean)],
                        "p (labels permuted)": [float(labels.p_value)], "key null mean": [float(keys.null_mean)],
                        "p (keys kept)": [float(keys.p_value)]}, index=pd.Index(["ap (closed form)"], name="profile"))
    out.attrs.update(n_perm=n_perm, method=f"{_interval_words(ci['interval'])} over documents; nulls: "
                                           f"{labels.attrs['method']}; {keys.attrs['method']}")
    return out


def coverage_results(path=None) -> pd.DataFrame:
    """The stored coverage table of ``benchmarks/bench_coverage.py`` (``data/coverage.csv``)."""
    from pathlib import Path

    from qkplast.shipped import resource_dir

    path = Path(path) if path is not None else resource_dir("data") / "coverage.csv"  # the checkout's, or the wheel's
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run python benchmarks/bench_coverage.py to make it")
    return pd.read_csv(path)


#: the coverage table's rows of the policy's interval: the bootstrap's ``lo``/``hi`` for its six quantities, and
#: :func:`qkplast.stats.bootstrap.document_interval` (each left-out capture re-analysed) for the AP_drop parts
POLICY_METHODS = ("policy", "policy (re-analysed)")


def coverage_summary(table: pd.DataFrame, n_docs: int) -> pd.DataFrame:
    """Coverage of each method at each document count (columns), per world and quantity (rows), as printed;
    and, in ``attrs``, the smallest coverage of the policy's interval at ``n_docs`` documents over every
    world and quantity (``policy_min``, its binomial standard error ``policy_min_se``) and where it occurs,
    the fewest replicates of any cell and the document counts measured."""
    wide = table.pivot_table(index=["world", "quantity", "method"], columns="docs", values="coverage", sort=False)
    policy = table[(table.docs == n_docs) & table.method.isin(POLICY_METHODS)]
    worst = policy.loc[policy.coverage.idxmin()] if len(policy) else None
    wide.attrs.update(policy_min=float(worst.coverage) if worst is not None else float("nan"),
                      policy_min_se=float(worst.coverage_se) if worst is not None else float("nan"),
                      policy_min_at=f"{worst.world}: {worst.quantity}" if worst is not None else "",
                      replicates=int(table.replicates.min()), docs=sorted(int(d) for d in table.docs.unique()))
    return wide


def corrections_verdicts(readings: list[dict], alpha: float = 0.05) -> pd.DataFrame:
    """The corrections page's empirical verdicts, decided together with Holm's correction.

    Each reading has ``item``, ``p`` (its permutation or t p-value) and, when the item has a contrast with
    an interval over documents, ``estimate``, ``lo``, ``hi`` and ``claim``. A reading is "confirmed" when
    its Holm-adjusted p is below ``alpha`` and, where it has an interval, the interval lies on the claimed
    side of zero (:func:`qkplast.stats.decision.verdict`); "contradicted" when the interval lies on the other
    side with the adjusted p below ``alpha``; otherwise "not distinguishable from the null" (no interval)
    or "left open" (an interval that does not decide, or that is undefined: NaN ends).
    """
    from qkplast.stats.decision import holm, verdict

    out = pd.DataFrame(readings).set_index("item")
    out["p (Holm)"] = holm(out["p"].to_numpy())
    has_interval = ["lo" in r for r in readings]  # an item with a contrast over documents, defined or not
    words = []
    for (_, r), interval in zip(out.iterrows(), has_interval):
        if not np.isfinite(r["p"]):
            words.append("left open")  # the statistic is undefined on this capture (stats.decision.null_verdict)
        elif interval and not (np.isfinite(r["lo"]) and np.isfinite(r["hi"])):
            words.append("left open")  # its interval is undefined (too few effective documents): p alone decides nothing
        elif interval:
            w = verdict(r.estimate, r.lo, r.hi, r["p (Holm)"], claim=r.claim, alpha=alpha)
            words.append({"supported": "confirmed"}.get(w, w))
        else:
            words.append("confirmed" if r["p (Holm)"] < alpha else "not distinguishable from the null")
    out["verdict"] = words
    out.attrs["rule"] = (f"Holm across {len(out)} readings at {alpha}; an interval over documents, where the item has "
                         "one, must lie on the claimed side of zero")
    return out


def listwise_document_intervals(capture: xr.Dataset, metrics: xr.Dataset, options: AnalysisOptions | None = None,
                                level: float = 0.95, n_perm: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Listwise means and the pairwise-listwise correlation with intervals over documents.

    Documents are the unit: heads share documents and queries, so a bootstrap over heads is not an interval
    over the data. Each quantity is recomputed with each document left out (:func:`qkplast.analysis.listwise.listwise` on the
    capture without it), and below 8 documents with each pair left out, and the policy's interval, the bias-corrected
    jackknife-t (``n - 1`` degrees of freedom), is built from those
    values (:func:`qkplast.stats.intervals.policy_interval`; for the correlation on Fisher's ``z = atanh(rho)``, mapped
    back, so it stays inside [-1, 1]). The correlation also gets a permutation p-value
    of no association across the heads (head labels of one side shuffled; two-sided).

    Returns
    -------
    pandas.DataFrame
        One row per set size: ``buckets with sets``, ``model`` and ``captured`` means with their intervals,
        and for m != 2 ``rho`` with its interval and ``p_perm``.
    """
    opt = AnalysisOptions.from_kwargs(options, **{k: v for k, v in metrics.attrs.get("options", {}).items()
                                                  if k in AnalysisOptions.__dataclass_fields__}) if options is None else options
    docs = np.unique(capture.doc.values)
    full = listwise_means(metrics)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        without = lambda left: listwise_means(listwise(capture.isel(  # noqa: E731
            sample=np.flatnonzero(~np.isin(capture.doc.values, left))), opt))
        jack = [without([d]) for d in docs]
        jack2 = [without(docs[list(p)]) for p in leave_two_out(len(docs))] if needs_leave_two_out(len(docs)) else None
    keys = list(full)
    # the correlations on Fisher's z = atanh(rho), where the jackknife-t is close to symmetric, and back with
    # tanh, so their intervals stay inside [-1, 1]; the means on their own scale
    is_rho = np.array([k[1] == "rho" for k in keys])
    to_z = lambda v: np.where(is_rho, np.arctanh(np.clip(v, -1 + 1e-12, 1 - 1e-12)), v)  # noqa: E731
    values = lambda js: to_z(np.array([[j.get(k, np.nan) for k in keys] for j in js]))  # noqa: E731
    ci = policy_interval(to_z(np.array([full[k] for k in keys])), values(jack),
                         values(jack2) if jack2 is not None else None, level)
    lo, hi = (np.where(is_rho, np.tanh(ci[e]), ci[e]) for e in ("lo", "hi"))
    iv = {k: (lo[i], hi[i]) for i, k in enumerate(keys)}
    rows = []
    for m in metrics.set_size.values:
        m = int(m)
        row = {"set size": "whole set" if m == 0 else m, "buckets with sets": int((metrics.n_sets.sel(set_size=m) > 0).sum())}
        for name, label in (("ap_set", "model"), ("ap_set_mc", "captured")):
            row[label], (lo, hi) = full[(m, name)], iv[(m, name)]
            row[f"{label} {int(100 * level)}% CI"] = f"[{lo:.3f}, {hi:.3f}]"
        if m != 2:
            row["rho"], (lo, hi) = full[(m, "rho")], iv[(m, "rho")]
            row[f"rho {int(100 * level)}% CI"] = f"[{lo:.3f}, {hi:.3f}]"
            # fewer than 3 heads with both values (a tiny model, a large set): no correlation, so no p-value
            row["p_perm"] = (pairwise_predicts_listwise(metrics, m, n_perm=n_perm, seed=seed)["p_perm"]
                             if np.isfinite(full[(m, "rho")]) else np.nan)
        rows.append(row)
    out = pd.DataFrame(rows).set_index("set size")
    out.attrs["method"] = (f"{_interval_words(ci['interval'])} over {len(docs)} documents ({len(docs) - 1} degrees of "
                           "freedom), each left-out capture re-analysed; permutation p over heads for rho")
    return out


def nearest_mass_table(metrics: xr.Dataset, level: float = 0.95) -> pd.DataFrame:
    """Softmax mass on the nearest eligible bucket per query bucket, with Student's t intervals over documents.

    Each document's value is the mean over heads of the mass its own queries put on its own keys
    (``nearest_mass_doc``, ``nearest_mass_position_doc``, ``nearest_share_doc``); the interval is over those
    per-document values (``n - 1`` degrees of freedom), the estimate their mean.
    """
    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per_doc = {"positional term alone": metrics.nearest_mass_position_doc.mean("head").values,
                   "full scores": metrics.nearest_mass_doc.mean("head").values,
                   "equal scores": metrics.nearest_share_doc.values}  # each [bucket, document]
    for b, qb in enumerate(metrics.query_bucket.values):
        row = {"query bucket": int(qb)}
        for label, v in per_doc.items():
            t = t_interval(v[b], level)
            row[label] = float(t["estimate"])
            row[f"{label} {int(100 * level)}% CI"] = (f"[{float(t['lo']):.3f}, {float(t['hi']):.3f}]"
                                                      if np.isfinite(t["lo"]) else "")
        rows.append(row)
    out = pd.DataFrame(rows).set_index("query bucket")
    out.attrs["method"] = f"Student's t over {metrics.sizes['document']} documents (per-document means over heads)"
    return out

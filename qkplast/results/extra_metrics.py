"""Figures and tables of the chapter "Beyond the thesis: open questions".

The figures each return a matplotlib Figure. The tables keep every interval's ends as numbers (``lo``, ``hi``
columns) for the page's decisions, and keep each interval inside its quantity's range: listwise means and masses
in [0, 1], correlations in [-1, 1] (:mod:`qkplast.stats.intervals`, ``bounds``).
"""

from __future__ import annotations

import warnings

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import xarray as xr


def _fig(ncols=1, width=6.4, height=4.0):
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False, layout="constrained")
    return fig, axes[0]


def _set_label(m: int) -> str:
    return "whole set" if m == 0 else f"m = {m}"


def _mean(x, dim):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return x.mean(dim, skipna=True)


def listwise_profiles(metrics: xr.Dataset):
    """Mean listwise plasticity over heads per query bucket and set size: fitted model (lines) and captured queries (markers)."""
    fig, (ax,) = _fig()
    tau = metrics.tau.values
    for c, m in enumerate(metrics.set_size.values):
        color = f"C{c}"
        ax.plot(tau, _mean(metrics.ap_set.sel(set_size=m), "head"), "-", color=color, label=f"{_set_label(int(m))}, model")
        ax.plot(tau, _mean(metrics.ap_set_mc.sel(set_size=m), "head"), "o", ms=3, color=color)
    ax.set(xlabel="query position tau (tokens)", ylabel="listwise plasticity AP_set", ylim=(0, 1),
           title="listwise plasticity (lines: Gaussian model, dots: captured queries)")
    ax.legend(fontsize=8)
    return fig


def pairwise_vs_listwise(metrics: xr.Dataset, set_size: int):
    """Per-head pairwise AP against listwise AP at ``set_size`` (means over the buckets where both exist)."""
    fig, (ax,) = _fig(width=4.8)
    both = metrics.ap_set.sel(set_size=set_size).notnull()
    x = _mean(metrics.ap_set.sel(set_size=2).where(both), "query_bucket")
    y = _mean(metrics.ap_set.sel(set_size=set_size).where(both), "query_bucket")
    ax.scatter(x, y, s=8, c=metrics.layer, cmap="viridis")
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.set(xlabel="pairwise AP (m = 2)", ylabel=f"listwise AP ({_set_label(set_size)})", xlim=(0, 1), ylim=(0, 1),
           title="one dot per head (colour: layer)")
    return fig


def nearest_mass(metrics: xr.Dataset):
    """Softmax mass on the nearest eligible bucket: positional term alone, full scores, equal scores."""
    fig, (ax,) = _fig()
    tau = metrics.tau.values
    for name, style, label in (("nearest_mass_position", "-o", "positional term alone"),
                               ("nearest_mass", "-s", "full scores (captured queries)")):
        v = metrics[name]
        mid = _mean(v, "head")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # bucket 0 has no eligible keys: NaN by design
            lo, hi = (v.quantile(q, "head", skipna=True) for q in (0.25, 0.75))
        ax.plot(tau, mid, style, ms=3, label=f"{label}: mean, 25-75% of heads")
        ax.fill_between(tau, lo, hi, alpha=0.2)
    ax.plot(tau, metrics.nearest_share, "k--", label="equal scores (share of keys)")
    ax.set(xlabel="query position tau (tokens)", ylabel="softmax mass on the nearest bucket", ylim=(0, 1.02))
    ax.legend(fontsize=8)
    return fig


def counterfactual_profiles(metrics: xr.Dataset):
    """Mean over heads of the four counterfactual plasticity profiles of the AP_drop decomposition."""
    fig, (ax,) = _fig()
    tau = metrics.tau.values
    labels = {"P1C1": "fitted model (= ap)", "P1C0": "drifts of queries and keys, content held fixed",
              "P0C1": "no drift, content per bucket", "P0C0": "neither (the baseline)"}
    for v, label in labels.items():
        ax.plot(tau, _mean(metrics.ap_counterfactual.sel(variant=v), "head"), "-o", ms=3, label=label)
    first, last = metrics.in_first20.values, metrics.in_last20.values
    ax.axvspan(tau[first].min() if first.any() else 0, tau[first].max() if first.any() else 0, color="0.9")
    ax.axvspan(tau[last].min() if last.any() else 0, tau[last].max() if last.any() else 0, color="0.9")
    ax.set(xlabel="query position tau (tokens)", ylabel="plasticity (mean over heads)", ylim=(0, 1),
           title="counterfactual profiles (grey: first and last 20%)")
    ax.legend(fontsize=8)
    return fig


def condition_bars(table: pd.DataFrame, quantities=("ap_drop", "ap_drop_baseline", "ap_drop_bias", "ap_drop_content",
                                                   "ap_drop_interaction")):
    """Estimates with their intervals per condition (rows) and quantity (colours)."""
    conditions = list(dict.fromkeys(table.condition))
    fig, (ax,) = _fig(width=8.0)
    width = 0.8 / len(quantities)
    for j, qty in enumerate(quantities):
        sub = table[table.quantity == qty].set_index("condition").loc[conditions]
        x = np.arange(len(conditions)) + (j - (len(quantities) - 1) / 2) * width
        ax.bar(x, sub.estimate, width, label=qty, color=f"C{j}")
        # the interval as a segment: the policy's interval is centred on the bias-corrected estimate, so the
        # plain estimate (the bar) may lie outside it on a few documents
        ax.vlines(x, sub.lo, sub.hi, color="k", lw=0.8)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(np.arange(len(conditions)), conditions, rotation=30, ha="right")
    ax.set(ylabel="mean over heads", title="AP_drop and its parts per condition (95% intervals over documents)")
    ax.legend(fontsize=8)
    return fig


def gqa_null(result: xr.Dataset, key_null: np.ndarray | None = None):
    """Permutation nulls of the GQA statistic with the observed value, and the per-layer statistic.

    ``result``: :func:`qkplast.stats.permutation_tests.gqa_similarity` (the label-permutation null); ``key_null``: the draws of
    the null that keeps every head's keys (:func:`gqa_reading`'s ``attrs["key_null"]``), drawn over it when given.
    """
    fig, (a, b) = _fig(2, width=4.8)
    null = np.asarray(result.null)
    draws = null if key_null is None else np.concatenate([null, np.asarray(key_null)])
    bins = np.linspace(min(draws.min(), float(result.statistic)), max(draws.max(), float(result.statistic)), 60)
    a.hist(null, bins=bins, color="0.6", label="labels permuted")
    if key_null is not None:
        a.hist(key_null, bins=bins, color="tab:blue", alpha=0.6, label="keys kept (queries exchanged)")
    a.axvline(float(result.statistic), color="tab:red", label="observed T")
    a.set(xlabel="within - between group distance", ylabel="permutations", title="within-layer permutation nulls")
    a.legend(fontsize=8)
    b.bar(result.layer_index, result.layer_statistic, color="tab:blue")
    b.axhline(0, color="k", lw=0.6)
    b.set(xlabel="layer", ylabel="within - between", title="per layer")
    return fig


# --------------------------------------------------------------------------- tables with intervals over documents


def _interval_words(name: str) -> str:
    from qkplast.stats.schema import INTERVAL_NAMES

    return INTERVAL_NAMES.get(name, name)


#: Version of the left-out values :func:`listwise_document_intervals` keeps (``store``): bump it when they change.
LISTWISE_SCHEMA = 1


def listwise_document_intervals(capture: xr.Dataset, metrics: xr.Dataset, options=None, level: float = 0.95,
                                n_perm: int = 2000, seed: int = 0, *, store=None) -> pd.DataFrame:
    """Listwise means and the pairwise-listwise correlation with intervals over documents, inside their ranges.

    Documents are the unit: heads share documents and queries, so an interval over heads is not one over the
    data. Each quantity is recomputed with each document, and below 8 documents each pair of documents, left out
    (:func:`qkplast.analysis.listwise.listwise` on the capture without them) and the policy's interval, the
    bias-corrected jackknife-t, is built from those values (:func:`qkplast.stats.intervals.policy_interval`) on the
    logit scale for the means (in [0, 1]) and on Fisher's ``z = atanh(rho)`` for the correlations, mapped back:
    no end leaves the range. Where a value sits on a bound the interval is undefined (NaN, ``reason`` says why).
    The correlation also gets a two-sided permutation p-value of no association across heads. ``store``
    (:func:`qkplast.rundir.product_store`) keeps the left-out captures' values in the run directory
    (``listwise-jackknife``, keyed by the capture's content, the options and the code) and reads them back.

    Returns
    -------
    pandas.DataFrame
        One row per set size: ``buckets with sets``; ``model``, ``captured`` (means over heads of each head's mean
        over buckets) with ``lo``/``hi`` columns (``model lo``, ...); for m != 2 ``rho``, ``rho lo``, ``rho hi`` and
        ``p_perm``; ``reason`` (empty where every interval of the row is defined). Numbers only.
    """
    from qkplast.analysis.listwise import listwise, listwise_means
    from qkplast.stats.permutation_tests import pairwise_predicts_listwise
    from qkplast.analysis.plasticity import PlasticityWarning
    from qkplast.options import AnalysisOptions
    from qkplast.stats.intervals import leave_two_out, needs_leave_two_out, policy_interval

    opt = options if options is not None else AnalysisOptions.from_kwargs(
        None, **{k: v for k, v in metrics.attrs.get("options", {}).items() if k in AnalysisOptions.__dataclass_fields__})
    docs = np.unique(capture.doc.values)
    full = listwise_means(metrics)
    keys = list(full)
    values = lambda js: np.array([[j.get(k, np.nan) for k in keys] for j in js])  # noqa: E731  [replicate, key]
    two = needs_leave_two_out(len(docs))

    def left_out() -> xr.Dataset:  # each left-out capture re-analysed whole (its own pairs and sets, as alone)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlasticityWarning)
            without = lambda left: listwise_means(listwise(capture.isel(  # noqa: E731
                sample=np.flatnonzero(~np.isin(capture.doc.values, left))), opt))
            jack = values([without([d]) for d in docs])
            jack2 = values([without(docs[list(p)]) for p in leave_two_out(len(docs))]) if two else None
        out = xr.Dataset({"jackknife": (("document", "key"), jack)},
                         coords={"key": [f"{m}:{name}" for m, name in keys], "document": docs.astype(str)})
        return out.assign(jackknife2=(("document_pair", "key"), jack2)) if two else out

    if store is None:
        kept = left_out()
    else:
        from qkplast.provenance import content_digest, product_provenance
        from qkplast.tensors import resolve_device

        kept = store("listwise-jackknife", {
            "schema": LISTWISE_SCHEMA, "statistic": "listwise_means of listwise, documents left out",
            "keys": [f"{m}:{name}" for m, name in keys], "options": opt.result_key(), "capture": content_digest(capture),
            "leave_two_out": bool(two),
            "provenance": product_provenance("analysis", "stats", "results/extra_metrics.py", "tensors.py", "options.py",
                                             device=str(resolve_device(opt.device)))}, left_out)
    is_rho = np.array([k[1] == "rho" for k in keys])
    bounds = (np.where(is_rho, -1.0, 0.0), np.ones(len(keys)))  # correlations in [-1, 1], means in [0, 1]
    ci = policy_interval(np.array([full[k] for k in keys]), kept["jackknife"].values,
                         kept["jackknife2"].values if two else None, level, bounds=bounds, unit="documents")
    at = {k: i for i, k in enumerate(keys)}
    rows = []
    for m in (int(m) for m in metrics.set_size.values):
        row = {"set size": "whole set" if m == 0 else m, "buckets with sets": int((metrics.n_sets.sel(set_size=m) > 0).sum())}
        names = [("ap_set", "model"), ("ap_set_mc", "captured")] + ([("rho", "rho")] if m != 2 else [])
        reasons = []
        for name, label in names:
            i = at[(m, name)]
            row[label], row[f"{label} lo"], row[f"{label} hi"] = full[(m, name)], ci["lo"][i], ci["hi"][i]
            if ci["reason"][i]:
                reasons.append(f"{label}: {ci['reason'][i]}")
        if m != 2:
            # fewer than 3 heads with both values (a tiny model, a large set): no correlation, so no p-value
            row["p_perm"] = (pairwise_predicts_listwise(metrics, m, n_perm=n_perm, seed=seed)["p_perm"]
                             if np.isfinite(full[(m, "rho")]) else np.nan)
        row["reason"] = "; ".join(reasons)
        rows.append(row)
    out = pd.DataFrame(rows).set_index("set size")
    out.attrs.update(level=level, method=(
        f"{_interval_words(ci['interval'])} over {len(docs)} documents ({len(docs) - 1} degrees of freedom), each "
        "left-out capture re-analysed, on the logit scale for the means and Fisher's z for rho, mapped back; "
        "permutation p over heads for rho"))
    return out


def nearest_mass_intervals(metrics: xr.Dataset, level: float = 0.95) -> pd.DataFrame:
    """Softmax mass on the nearest eligible bucket per query bucket, with intervals over documents inside [0, 1].

    Each document's value is the mean over heads of the mass its own queries put on its own keys
    (``nearest_mass_doc``, ``nearest_mass_position_doc``, ``nearest_share_doc``); the estimate is their mean, the
    interval Student's t on the logit scale of that mean (``n - 1`` degrees of freedom, delta method), mapped
    back (:func:`qkplast.stats.intervals.bounded_t_interval`). A mean on a bound (bucket 1, whose only eligible
    bucket is the nearest) has no interval: NaN ends.

    Returns
    -------
    pandas.DataFrame
        One row per query bucket; for each of "positional term alone", "full scores", "equal scores" the mean and
        its ``lo``/``hi``. Numbers only.
    """
    from qkplast.stats.intervals import UNIT_RANGE, bounded_t_interval

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per_doc = {"positional term alone": metrics.nearest_mass_position_doc.mean("head").values,
                   "full scores": metrics.nearest_mass_doc.mean("head").values,
                   "equal scores": metrics.nearest_share_doc.values}  # each [bucket, document]
        out = {}
        for label, v in per_doc.items():
            t = bounded_t_interval(v, UNIT_RANGE, level, axis=1, unit="documents")
            out.update({label: t["estimate"], f"{label} lo": t["lo"], f"{label} hi": t["hi"]})
    out = pd.DataFrame(out, index=pd.Index(metrics.query_bucket.values.astype(int), name="query bucket"))
    out.attrs.update(level=level, method=f"Student's t over {metrics.sizes['document']} documents (per-document means "
                                         "over heads) on the logit scale, mapped back into [0, 1]")
    return out


class KeyNullContrast:
    """The statistic of :func:`gqa_reading`'s interval: ``T`` and the contrast ``T - mean(keys-kept null)`` of a
    capture ``[2]``, from its closed-form cross profiles (:func:`qkplast.analysis.gqa.cross_profiles`) and the same
    ``n_perm`` permutations (``seed``) of the null (:func:`qkplast.stats.permutation_tests.gqa_key_null`).

    ``of_cuts(capture, keeps, pairs)`` gives ``[cut, 2]`` for many cuts of one capture at once (the cross profiles in
    one batch, :func:`qkplast.analysis.gqa.cross_profiles_of_cuts`), as :func:`qkplast.stats.bootstrap.document_interval`
    asks for the left-out captures; each cut draws its own key pairs, as the capture alone would.
    """

    def __init__(self, metrics: xr.Dataset, options, n_perm: int, seed: int):
        self.metrics, self.options, self.n_perm, self.seed = metrics, options, n_perm, seed

    def key_null(self, cross: xr.DataArray) -> xr.Dataset:
        from qkplast.stats.permutation_tests import gqa_key_null

        return gqa_key_null(self.metrics, cross, n_perm=self.n_perm, seed=self.seed)

    @staticmethod
    def t_and_contrast(keys: xr.Dataset) -> np.ndarray:
        return np.array([float(keys.statistic), float(keys.statistic) - float(keys.null_mean)])  # [T, contrast]

    def __call__(self, capture: xr.Dataset) -> np.ndarray:
        return self.of_cuts(capture, [np.ones(capture.sizes["sample"], dtype=bool)])[0]

    def of_cuts(self, capture: xr.Dataset, keeps, pairs=None) -> np.ndarray:
        from qkplast.analysis.gqa import cross_profiles_of_cuts

        cross = cross_profiles_of_cuts(capture, keeps, self.options, pairs)  # [cut, head, kv_slot, query_bucket]
        return np.stack([self.t_and_contrast(self.key_null(cross.isel(cut=c))) for c in range(cross.sizes["cut"])])


#: Version of the products :func:`gqa_reading` keeps (``store``): bump it when they change.
GQA_SCHEMA = 1


def gqa_reading(capture: xr.Dataset, metrics: xr.Dataset, options=None, n_perm: int = 2000, seed: int = 0,
                level: float = 0.95, *, store=None) -> pd.DataFrame:
    """The GQA statistic ``T`` against the null that keeps every head's keys, as the page decides it.

    ``T`` (:mod:`qkplast.analysis.gqa`) is compared with the distribution of the keys-kept null
    (:func:`qkplast.stats.permutation_tests.gqa_key_null`: queries exchanged within layers, each head keeping its keys),
    whose mean is not 0: the heads of a group share their key pairs. The contrast is ``T - mean(null)``
    (``contrast``): how much more alike a group's heads are than their shared keys make them. Both terms are
    computed from the same documents, so the contrast's interval is the policy's interval over documents of the
    contrast itself: each left-out capture's closed-form cross profiles give its own ``T`` and its own null mean
    (the same ``n_perm`` permutations, ``seed``), so the interval carries the variance of both and their
    covariance. The null's spread enters the decision through ``p (keys kept)``, the one-sided rank p of ``T``
    among the null's draws; ``key null lo`` / ``key null hi`` are its central ``level`` range. The
    label-permutation null (which counts the shared keys as coordination) is reported beside it.

    The left-out captures' cross profiles are computed in one batch (:class:`KeyNullContrast`); ``store``
    (:func:`qkplast.rundir.product_store`) keeps the whole capture's keys-kept null (``gqa-key-null``) and the
    left-out values (``gqa-jackknife``) in the run directory and reads them back.

    Returns
    -------
    pandas.DataFrame
        One row (``ap (closed form)``): ``T``, ``T lo``, ``T hi``, ``within group``, ``between groups``,
        ``label null mean``, ``p (labels permuted)``, ``key null mean``, ``key null lo``, ``key null hi``,
        ``contrast``, ``contrast lo``, ``contrast hi``, ``p (keys kept)``; ``attrs["key_null"]`` holds the
        null's draws, ``attrs["jackknife"]`` the left-out captures' ``(T, contrast)``.
    """
    from qkplast.analysis.gqa import cross_profiles_of_cuts
    from qkplast.stats.permutation_tests import gqa_similarity
    from qkplast.options import AnalysisOptions
    from qkplast.provenance import content_digest, product_provenance
    from qkplast.stats.bootstrap import document_interval
    from qkplast.tensors import resolve_device

    opt = AnalysisOptions.from_kwargs(options)
    labels = gqa_similarity(metrics, "ap", n_perm=n_perm, seed=seed)
    stat = KeyNullContrast(metrics, opt, n_perm, seed)
    whole = np.ones(capture.sizes["sample"], dtype=bool)
    keys = stat.key_null(cross_profiles_of_cuts(capture, [whole], opt).isel(cut=0)) if store is None else None
    if store is not None:
        key = {"schema": GQA_SCHEMA, "statistic": "gqa_key_null of the closed-form cross profiles",
               "options": opt.result_key(), "n_perm": int(n_perm), "seed": int(seed),
               "groups": content_digest(metrics, ("layer", "kv_head"), ()),
               "provenance": product_provenance("analysis", "stats", "results/extra_metrics.py", "tensors.py",
                                                "options.py", device=str(resolve_device(opt.device)))}
        keys = store("gqa-key-null", {**key, "capture": content_digest(capture)},
                     lambda: stat.key_null(cross_profiles_of_cuts(capture, [whole], opt).isel(cut=0)))
    est = stat.t_and_contrast(keys)  # [2]
    ci = document_interval(capture, stat, level, estimate=est, store=store, stem="gqa-jackknife",
                           key=key if store is not None else None)
    null = np.asarray(keys.null)
    q_lo, q_hi = (float(np.quantile(null, q)) for q in ((1 - level) / 2, (1 + level) / 2))
    lo, hi = np.asarray(ci["lo"], float), np.asarray(ci["hi"], float)  # [2]
    out = pd.DataFrame({"T": [est[0]], "T lo": [lo[0]], "T hi": [hi[0]],
                        "within group": [float(labels.within)], "between groups": [float(labels.between)],
                        "label null mean": [float(labels.null_mean)], "p (labels permuted)": [float(labels.p_value)],
                        "key null mean": [float(keys.null_mean)], "key null lo": [q_lo], "key null hi": [q_hi],
                        "contrast": [est[1]], "contrast lo": [lo[1]], "contrast hi": [hi[1]],
                        "p (keys kept)": [float(keys.p_value)]},
                       index=pd.Index(["ap (closed form)"], name="profile"))
    out.attrs.update(n_perm=n_perm, level=level, key_null=null, jackknife=np.asarray(ci["jackknife"]),
                     method=(f"T and contrast (T - the keys-kept null's mean, each left-out capture with its own "
                             f"null mean): {_interval_words(ci['interval'])} over documents; nulls: "
                             f"{labels.attrs['method']}; {keys.attrs['method']}"))
    return out

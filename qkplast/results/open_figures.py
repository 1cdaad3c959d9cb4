"""Figures of the chapter "Beyond the thesis: open questions"; each returns a matplotlib Figure."""

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


def gqa_null(result: xr.Dataset):
    """Permutation null of the GQA statistic with the observed value, and the per-layer statistic."""
    fig, (a, b) = _fig(2, width=4.8)
    a.hist(result.null, bins=40, color="0.6")
    a.axvline(float(result.statistic), color="tab:red", label=f"observed (p = {float(result.p_value):.4f})")
    a.set(xlabel="within - between group distance", ylabel="permutations", title="within-layer permutation null")
    a.legend(fontsize=8)
    b.bar(result.layer_index, result.layer_statistic, color="tab:blue")
    b.axhline(0, color="k", lw=0.6)
    b.set(xlabel="layer", ylabel="within - between", title="per layer")
    return fig

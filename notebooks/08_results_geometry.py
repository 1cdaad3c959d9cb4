# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: -papermill,-execution,-ExecuteTime
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -papermill,-widgets
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Results 6.1: the geometry of positional bias
#
# Section 6.1 of the thesis reports, over 3,239 heads of 11 models, that position dominates the variance of
# post-RoPE queries and keys, that PCA's first component makes queries look more positional than keys, that
# the drift axis reverses this, and that nearly every head carries a positive bias strength. This page
# draws the same figures from this project's run and sets every number beside the thesis's.
#
# **Comparability.** The quantities and their definitions are identical. The setting is not: the thesis
# captured 300 heads of each of 11 models between 0.6B and 14B parameters on 128K-token LongBench-Pro
# documents, while this run's model, heads, windows and corpus are printed below (read from the capture).
# Differences below therefore say how this model on this context differs from the thesis's models, not
# whether the thesis's numbers reproduce.

# %% tags=["parameters"]
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run`; its manifest holds the capture and analysis settings
n_boot = 1000  # bootstrap replicates over documents for the interval of the mean bias strength (at least 1000 for 95% percentile and BCa end points)
study = ""  # a study file or directory (qkplast study): the cells at the end read all its runs; empty: this run only

# %%
import numpy as np

import qkplast.results.figures as qp
from qkplast.results import tables as results
from qkplast.rundir import chapter_run

run = chapter_run(run_dir, globals())  # the run's settings from its manifest (defaults for a new run), -p overrides; prints what it holds
capture, metrics = run.capture, run.metrics

# %% [markdown]
# ## The numbers of section 6.1, side by side

# %%
table = results.geometry_table(metrics)
print(table.attrs["comparability"])
table

# %% [markdown]
# ## Position on each principal component (Fig. 6.1)

# %%
fig = qp.pc_correlations(metrics)

# %% [markdown]
# ## The drift axis reverses the Q/K order (Fig. 6.2)

# %%
fig = qp.axis_reversal(metrics)

# %% [markdown]
# ## Taxonomy (Fig. A.1)
#
# The thesis finds Llama heads high on both axes, small Qwen models Q-positional and Ministral moderate.
# This run's shares of the four classes (computed, largest first):

# %%
shares = metrics.taxonomy.to_series().value_counts(normalize=True)
print("; ".join(f"{name}: {share:.1%}" for name, share in shares.items()))
print(f"the largest class is {shares.index[0]!r}")
fig = qp.taxonomy_scatter(metrics)

# %% [markdown]
# ## Bias strength (Fig. A.2), with a bootstrap interval
#
# The thesis reports means of $3.0\times10^{-4}$ (Ministral-3), $0.8$-$1.0\times10^{-3}$ (Qwen-3) and
# $6.0$-$7.0\times10^{-4}$ (Llama-3.2) per family, without uncertainty. Bias strength is in score units per
# token, so its size depends on the scale of each model's query and key vectors; only its sign and the
# spread across heads compare across models. The intervals are over documents (`n_boot` bootstrap
# replicates; the note under the table states the count and how replicates are computed, see
# `qkplast.stats.bootstrap`). The first is the inference policy's interval for this many documents (the
# bias-corrected jackknife-t, below 8 documents with the corrected estimate's own standard error, chosen by its
# measured coverage,
# {doc}`07_corrections`); basic, percentile, BCa and jackknife-t are shown beside it.

# %%
boot = run.bootstrap(n_boot)
intervals = results.with_intervals(boot)
print(intervals.attrs["note"])
intervals.loc[[m for m in ("bias_strength", "key_position_slope") if m in intervals.index]]

# %% [markdown]
# ## How much of the key-position preference is bias strength
#
# Bias strength is the drift-axis part of the slope of the mean query's score over key position; the whole
# slope is $\mu_Q^\top\beta_K$ (`key_position_slope`, {prf:ref}`prop-bias-strength` in {doc}`04_rotation`). The
# thesis treats the two as one ("exact by construction"). Their ratio over heads:

# %%
share = results.bias_share(metrics)
print(f"key_position_slope / bias_strength: median {share['ratio, median']:.2f} (5-95% over heads "
      f"{share['ratio, 5% quantile']:.2f}-{share['ratio, 95% quantile']:.2f}); bias_strength carries about "
      f"{100 * share['share of the slope on axis a (median)']:.0f}% of the linear key-position preference (median head)")
share.round(3)

# %%
fig = qp.bias_distribution(metrics)

# %% [markdown]
# ## Bias against separation (Fig. A.3)
#
# The thesis's Simpson's paradox: the pooled correlation between bias strength and separation strength is
# $+0.48$, but $-0.65$ within the Llama family. One model has one family; the analogue inside it is a split by
# depth. Whether pooled and within-group correlations disagree here is printed below.

# %%
bands = results.bias_by_layer_band(metrics)
pooled = bands.pearson_r.iloc[0]
flips = bool((np.sign(bands.pearson_r.iloc[1:]) != np.sign(pooled)).any())
print(f"pooled r = {pooled:.2f}; a layer band with the opposite sign: {flips}")
bands

# %%
fig = qp.bias_vs_separation(metrics)

# %% [markdown]
# ## Across the runs of a study
#
# With the `study` parameter set (`bash scripts/book.sh STUDY.yaml` sets it), this section reads every run
# of the study and sets section 6.1's quantities for each run beside the thesis's pooled values, in study
# order. The same caveat as above holds run by run: the settings differ from the thesis's, so the
# comparison is of kind. Without a study the section is empty.

# %%
if study:
    from qkplast.results import crossrun

    print(f"study {crossrun.as_study(study).name}: runs without an analysis yet: {crossrun.missing_runs(study) or 'none'}")
    display(crossrun.geometry_across(study))

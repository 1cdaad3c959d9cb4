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
# # Results 6.2: plasticity profiles
#
# Section 6.2 of the thesis shows that plasticity falls with query position in every model it examined, by
# 0.07-0.08 (Ministral-3), 0.16-0.19 (Qwen-3) and 0.17-0.23 (Llama-3.2) between the first and the last fifth
# of a 128K context (Table 6.1), that it depends on two distances (Fig. 6.3), and that heads differ widely
# (Fig. 6.4). This page shows the same for this project's run, with three additions the thesis names as
# open (section 7.5): bootstrap intervals over documents, the same model on prose and on code, and how well
# the Gaussian closed form agrees with the Monte Carlo estimate.
#
# **Comparability.** A fifth of this run's window (printed below, from the capture) is far shorter than a
# fifth of the thesis's 128K window (26K tokens). The profiles compare in shape, and AP_drop compares as
# "how much plasticity is lost across the window the model was given", not at equal distances.

# %% tags=["parameters"]
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run`; its manifest holds the capture and analysis settings
n_boot = 1000  # bootstrap replicates over documents for the intervals of the aggregates (at least 1000 for 95% percentile and BCa end points)
code_corpus = "stdlib-code"  # the same analysis on code: the standard library's own source
study = ""  # a study file or directory (qkplast study): the cells at the end read all its runs; empty: this run only

# %%

import qkplast.results.figures as qp
from qkplast.results import tables as results
from qkplast.rundir import chapter_run

run = chapter_run(run_dir, globals())  # the run's settings from its manifest (defaults for a new run), -p overrides; prints what it holds
capture, metrics = run.capture, run.metrics
model, corpus = run.options.model, run.options.corpus

# %% [markdown]
# ## Table 6.1, with this run in the first row

# %%
quintiles = results.quintile_table({model: metrics})
quintiles

# %%
fig = qp.quintile_profiles(quintiles)

# %% [markdown]
# ## Uncertainty: bootstrap over documents
#
# The thesis's tables carry no uncertainty. Here every aggregate gets an interval over documents: the
# inference policy's interval first (the bias-corrected jackknife-t, below 8 documents with the corrected
# estimate's own standard error, chosen by its measured coverage,
# {doc}`07_corrections`), and beside it the basic, percentile, BCa and
# jackknife-t intervals of a bootstrap with `n_boot` replicates (the note states the count and the method).
# With the handful of documents of the default run the intervals are wide: whether the policy's interval
# for AP_drop excludes zero is the first thing to read.

# %%
boot = run.bootstrap(n_boot)
intervals = results.with_intervals(boot)
print(intervals.attrs["note"])
print(f"{run.capture.attrs['n_docs']} windows of {run.capture.attrs['seq_len']} tokens (a fifth: "
      f"{run.capture.attrs['seq_len'] // 5} tokens)")
drop_lo = float(boot["lo"].sel(metric="ap_drop"))
print(f"AP_drop: the policy's interval ({boot.attrs['interval']}) excludes zero: {drop_lo > 0}")
intervals

# %% [markdown]
# ## Two distances (Fig. 6.3) and heads (Fig. 6.4)

# %%
fig = qp.plasticity_map(metrics)

# %%
fig = qp.plasticity_profile(metrics)

# %% [markdown]
# ## Is the Gaussian closed form right? (per bucket)
#
# For each query bucket: the mean closed-form and Monte Carlo plasticity over heads, their mean absolute
# difference, the share of heads where they agree within 0.05, and their correlation across heads.

# %%
results.gaussian_agreement(metrics)

# %% [markdown]
# ## Prose and code
#
# The thesis computed everything on one dataset. Here the same model, capture settings and analysis run on
# the Python documentation (prose) and on the standard library's source (code). The code capture is made by
# `qkplast run` beside the prose, sized to what the code corpus yields: the run's windows where it fills them,
# otherwise fewer windows or shorter ones (the line below says which); a corpus that fills no two windows, or
# the run's own corpus, gives no comparison, and the note says so.

# %%
code, code_note = run.code(code_corpus)  # run_dir/code, as `qkplast run` sized it; None when left out
print(code_note)
if code is not None:
    code_metrics, code_boot = code.metrics, code.bootstrap(n_boot)
    comparison = results.corpus_comparison({corpus: metrics, code_corpus: code_metrics},
                                           {corpus: boot, code_corpus: code_boot})
    display(comparison)

# %%
if code is not None:
    fig = qp.quintile_profiles(results.quintile_table({f"{model} ({corpus})": metrics,
                                                       f"{model} ({code_corpus})": code_metrics},
                                                      include_thesis=False))

# %% [markdown]
# ## Across the runs of a study
#
# With the `study` parameter set, Table 6.1 gets one row per run of the study (study order) above the
# thesis's rows, with the 95% percentile interval of each run's AP_drop over heads (1000 bootstrap
# replicates of the head sample; it says how much the mean depends on which heads were sampled, not how it
# varies over documents, which the document bootstrap above measures for the default run). The figure
# draws every run's profile over the context beside the thesis's models. Without a study the section is
# empty.

# %%
if study:
    from qkplast.results import crossrun

    display(crossrun.table_6_1(study))
    fig = crossrun.profiles_figure(study)

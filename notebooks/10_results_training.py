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
# # Results 6.3: training dynamics
#
# Section 6.3 of the thesis follows SmolLM3-3B through ten checkpoints: positional structure appears early in
# pre-training, bias strength doubles during pre-training and collapses tenfold during long-context
# extension, yet AP_drop triples, so removing bias does not by itself keep distant positions plastic
# (Table 6.2, Figs. 6.5-6.6, Table A.1).
#
# This page runs the same analysis over any list of checkpoints given as the `checkpoints` parameter:
# local checkpoint directories, or hub ids with a revision as `owner/name@revision`. Each checkpoint gets
# its own run directory under `run_dir/checkpoints/`. The SmolLM3 checkpoints are not reachable from this
# project's machines, so by default the list is empty and the page shows the thesis's reference values.

# %% tags=["parameters"]
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run`; its manifest holds the capture settings
checkpoints = []  # e.g. ["HuggingFaceTB/SmolLM3-3B-checkpoints@stage1-step-40000", ...]; empty: thesis values
study = ""  # a study file or directory (qkplast study): the cells at the end read all its runs; empty: this run only

# %%
import pandas as pd

import qkplast.results.figures as qp
from qkplast.results import reference
from qkplast.results import tables as results
from qkplast.rundir import checkpoint_metrics, run_settings

# %% [markdown]
# ## This project's checkpoints

# %%
if checkpoints:
    # the run's capture settings on every checkpoint; `qkplast run` captured them before this kernel started
    ours = results.trajectory_table(checkpoint_metrics(checkpoints, run_dir, run_settings(run_dir, globals())[0]))
    fig = qp.trajectory(ours, title="this project's checkpoints")
    display(ours.round(4))
else:
    print("No checkpoints were given (parameter `checkpoints`), and the thesis's SmolLM3-3B checkpoints cannot be "
          "downloaded here: the tables and figures below are the thesis's reference values, not measurements of "
          "this project.")

# %% [markdown]
# ## The thesis's trajectory (Table 6.2, Figs. 6.5-6.6)

# %%
thesis = results.thesis_trajectory()
thesis

# %%
fig = qp.trajectory(thesis)

# %% [markdown]
# ## Per-position plasticity during long-context extension (Table A.1)
#
# The caption says near positions hold steady while distant ones fall as the window grows. The numbers
# agree within each phase; across phases, every position the two phases share is 0.03-0.06 *higher* after
# the 32K-to-64K phase, so "holds steady" is true only within a phase.

# %%
results.thesis_lc_positions()

# %% [markdown]
# Some of these entries lie inside the first position bucket of their phase, where the method of section
# 4.4.5 (keys from earlier buckets only) has no key pairs and so no plasticity; they must have been computed
# by some other rule, which the thesis does not state ({doc}`07_corrections`, item 13):

# %%
reference.table_a1_in_first_bucket()

# %% [markdown]
# ## Across the runs of a study
#
# When the `study` parameter names a checkpoint series (every run a revision of one model, as in
# `studies/smollm3-checkpoints.yaml`), the trajectory of Table 6.2 is measured along it, in study order,
# with the thesis's row for the same checkpoint where there is one. A study of different models or
# settings is not a trajectory, and the section says so.

# %%
if study:
    from qkplast.results import crossrun

    if crossrun.is_checkpoint_series(study):
        study_trajectory = crossrun.trajectory(study)
        display(study_trajectory.round(4))
        fig = qp.trajectory(study_trajectory, title=f"study {crossrun.as_study(study).name}: checkpoints in study order")
    else:
        print(f"study {crossrun.as_study(study).name} is not a checkpoint series (its runs are not revisions of one "
              "model), so it has no training trajectory")

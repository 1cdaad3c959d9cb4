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
# (Table 6.2, Figs. 6.5-6.6, Table A.1). Those checkpoints are 3B models that cannot be fetched here, and one
# model cannot say whether the collapse comes from the raised RoPE base or from the longer windows: the thesis
# lists controlled training as future work.
#
# This page trains that experiment in miniature and reruns it: a small Llama pre-trained on short windows
# (stage A), then extended to four times the window from the same final checkpoint in arms that change one
# thing each (stage B), over several seeds. Every checkpoint is a branch of a local Hugging Face cache and is
# measured exactly as the thesis's checkpoints were. The predictions below were committed before the first
# full training ran; the thesis's own tables follow at the end, with the cells that read a checkpoint-series
# study.

# %% tags=["parameters"]
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run`; the miniature trains into run_dir/training/
training = ""  # "": the finished training under run_dir/training with the most tokens, else studies/miniature.yaml; or a preset ("smoke"), a training study file or a training directory
checkpoints = []  # e.g. ["HuggingFaceTB/SmolLM3-3B-checkpoints@stage1-step-40000", ...]; empty: thesis values
study = ""  # a study file or directory (qkplast study): the cells at the end read all its runs; empty: this run only

# %%
import numpy as np
import pandas as pd
from scipy import stats

import qkplast.results.figures as qp
from qkplast.results import reference
from qkplast.results import tables as results
from qkplast.pipeline.batch import run_settings

# %% [markdown]
# ## Predictions, registered before the first training
#
# The miniature is trained in two stages. Stage A pre-trains on packed windows of $L$ tokens at RoPE base
# $\theta$; stage B continues from the final stage-A checkpoint on windows of $4L$ tokens cut from single long
# documents, in three arms that see the same tokens at the same steps:
#
# | arm | RoPE base | window | what it isolates |
# |---|---|---|---|
# | `rescaled` | $10\,\theta$ | $4L$ | the SmolLM3 recipe: base and window raised together |
# | `control` | $\theta$ | $4L$ | the window alone |
# | `rescaled-short` | $10\,\theta$ | $L$ | the base alone |
#
# Every checkpoint is captured on held-out documents (never trained on) at the window it was trained at, and
# the stage-A checkpoints also at the extension window. Each quantity is a mean over the model's heads, one
# value per seed; **seeds are the unit** of every interval. Steps are counted within their stage, so a
# checkpoint's place is its share of its stage ("10%" of stage A, "20%" of the extension: SmolLM3's
# "step 4K" of 20K).
#
# The four predictions, from the thesis's SmolLM3 pattern, and the contrast that decides each (the value at
# the later checkpoint minus the value at the earlier one, per seed):
#
# 1. **Bias strength grows during stage A**: mean $|$bias_strength$|$ at the end of stage A above its value at 10%
#    of stage A (claim: greater).
# 2. **It falls at extension onset in the rescaled arm, and by more than in the control arm**: at the extension
#    checkpoint nearest 20%, the rescaled arm's mean $|$bias_strength$|$ below the end of stage A (claim: less),
#    and below the control arm's at the same step (claim: less). Both arms start from the same weights, so the
#    second contrast is the difference of their falls.
# 3. **In the rescaled arm AP_first20% rises while AP_drop rises**: at the end of the extension, both above their
#    values at the end of stage A (each at its own window, as the thesis compares stage 3 at 4K with the
#    extension at 32K; claim: greater, twice).
# 4. **Position structure is set early in stage A**: the share of position-dominated heads and the mean
#    $|r_q^{(0)}|$ at 10% of stage A equal their end-of-stage-A values within margins of 0.15 (share of heads)
#    and 0.10 (correlation) (claim: equivalent).
#
# **Decision rule.** For each contrast: Student's $t$ interval over the seeds at 95%
# (`qkplast.stats.intervals.t_interval`) and its two-sided $p$-value; Holm's correction across the five
# directional readings of predictions 1-3 (`qkplast.stats.verdict.holm`); the verdict word from
# `qkplast.stats.verdict.verdict`: *supported* when the interval excludes zero on the predicted side and the
# adjusted $p < 0.05$, *contradicted* when it excludes zero on the other side with adjusted $p < 0.05$, *left
# open* otherwise. Prediction 4 uses the equivalence rule: *supported* when the interval lies inside
# $(-\text{margin}, \text{margin})$, *contradicted* when it lies wholly outside, *left open* otherwise. A
# prediction with two readings is supported only when both are (`qkplast.stats.verdict.conjunction`). The
# readings marked E below are exploratory: their intervals are shown, they get no verdict and do not enter the
# correction. A miniature of about a million parameters need not behave as a 3B model; whatever the seeds
# show is reported as the finding.

# %%
READINGS = {  # contrast per seed: metric at "to" minus metric at "from"; a place is (arm, share of its stage, window)
    "P1 |bias| grows in stage A":
        {"metric": "abs_bias_strength", "from": ("stageA", 0.1, "own"), "to": ("stageA", 1.0, "own"), "claim": "greater"},
    "P2a |bias| falls at onset (rescaled)":
        {"metric": "abs_bias_strength", "from": ("stageA", 1.0, "own"), "to": ("rescaled", 0.2, "own"), "claim": "less"},
    "P2b ... more than in control":
        {"metric": "abs_bias_strength", "from": ("control", 0.2, "own"), "to": ("rescaled", 0.2, "own"), "claim": "less"},
    "P3a AP_first20 rises (rescaled)":
        {"metric": "ap_first20", "from": ("stageA", 1.0, "own"), "to": ("rescaled", 1.0, "own"), "claim": "greater"},
    "P3b AP_drop rises (rescaled)":
        {"metric": "ap_drop", "from": ("stageA", 1.0, "own"), "to": ("rescaled", 1.0, "own"), "claim": "greater"},
    "P4a position-dominated share set by 10%":
        {"metric": "share_position_dominated", "from": ("stageA", 0.1, "own"), "to": ("stageA", 1.0, "own"),
         "claim": "equivalent", "margin": 0.15},
    "P4b |r_q^(0)| set by 10%":
        {"metric": "abs_r_q_0", "from": ("stageA", 0.1, "own"), "to": ("stageA", 1.0, "own"),
         "claim": "equivalent", "margin": 0.10},
    "E1 base alone: |bias| at onset (rescaled-short)":
        {"metric": "abs_bias_strength", "from": ("stageA", 1.0, "own"), "to": ("rescaled-short", 0.2, "own"), "claim": None},
    "E2 base alone: AP_drop at the end (rescaled-short)":
        {"metric": "ap_drop", "from": ("stageA", 1.0, "own"), "to": ("rescaled-short", 1.0, "own"), "claim": None},
    "E3 base at the long window: AP_drop, rescaled - control":
        {"metric": "ap_drop", "from": ("control", 1.0, "own"), "to": ("rescaled", 1.0, "own"), "claim": None},
    "E4 measuring window: |bias| of final stage A, 4L - L":
        {"metric": "abs_bias_strength", "from": ("stageA", 1.0, "own"), "to": ("stageA", 1.0, "ext"), "claim": None},
}
PREDICTIONS = {"1": ["P1 |bias| grows in stage A"],
               "2": ["P2a |bias| falls at onset (rescaled)", "P2b ... more than in control"],
               "3": ["P3a AP_first20 rises (rescaled)", "P3b AP_drop rises (rescaled)"],
               "4": ["P4a position-dominated share set by 10%", "P4b |r_q^(0)| set by 10%"]}

# %% [markdown]
# **What the seed count can detect.** A directional reading is supported when the $t$ test over $n$ seeds
# rejects at the Holm level, which for the reading with the smallest $p$ among $m = 5$ is $0.05/5$ and for the
# last one $0.05$. The smallest mean contrast detected with 80% power, in units of the contrast's standard
# deviation across seeds (from the noncentral $t$ distribution), and the largest seed-to-seed standard
# deviation an equivalence reading can afford (its interval's half-width $t_{0.975, n-1}\, s/\sqrt{n}$ must
# fit inside the margin):

# %%
def detectable_effect(n: int, alpha: float, power: float = 0.8) -> float:
    """Smallest mean / SD a two-sided one-sample t test over n units detects with the given power."""
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    grid = np.linspace(0.05, 40, 8000)
    achieved = stats.nct.sf(crit, n - 1, grid * np.sqrt(n)) + stats.nct.cdf(-crit, n - 1, grid * np.sqrt(n))
    return float(grid[np.argmax(achieved >= power)])


design = pd.DataFrame({n: {"detectable / SD, first Holm step (alpha 0.01)": detectable_effect(n, 0.05 / 5),
                           "detectable / SD, last Holm step (alpha 0.05)": detectable_effect(n, 0.05),
                           "equivalence: largest SD / margin": np.sqrt(n) / stats.t.ppf(0.975, n - 1)}
                       for n in (3, 5)}).rename_axis(columns="seeds")
design.round(2)

# %% [markdown]
# ## This project's checkpoints

# %%
if checkpoints:
    # the run's capture settings on every checkpoint; `qkplast run` captured them before this kernel started
    settings = {k: v for k, v in run_settings(run_dir, globals())[0].to_dict().items() if k not in ("model", "revision")}
    ours = results.trajectory_table(results.checkpoint_metrics(checkpoints, run_dir, **settings))
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

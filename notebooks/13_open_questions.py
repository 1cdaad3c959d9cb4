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
# # Beyond the thesis: open questions
#
# The thesis closes with questions it could not settle (sections 7.5 and 7.6, and the questions its defence
# anticipated). Four of them can be answered with the data this book already captures, for any model:
#
# 1. **Pairs or lists?** Plasticity judges a head by key *pairs*; softmax weighs *all* keys at once. Does a
#    head that is plastic pairwise stay plastic when a whole set of keys competes?
# 2. **Bias or content?** The thesis attributes the part of $\mathrm{AP}_{\mathrm{drop}}$ that survives a
#    collapse of positional bias to a decay of the content signal, without measuring it. We split
#    $\mathrm{AP}_{\mathrm{drop}}$ exactly into a positional part, a content part and their interaction.
# 3. **What drives content decay?** Section 7.6 proposes controlled experiments on the RoPE parameters, the
#    context length and the presence of initial tokens. We run a small grid of them on the embedded model.
# 4. **Do GQA groups act together?** Query heads that share a key head may develop coordinated or divergent
#    plasticity profiles (7.5). We test it against a permutation null.
#
# Every number below comes with an interval and, where a claim is made, a null to compare it with.

# %% tags=["parameters"]
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run`; its manifest holds the capture and analysis settings
n_boot = 2000  # bootstrap replicates of every interval on this page
n_perm = 2000  # permutations of every null on this page
cond_docs = None  # documents of the content-decay conditions, the same in every condition (None: min(6, docs))
cond_seq_len = None  # window of the conditions' baseline, 16 buckets (None: min(1024, seq_len))
cond_samples_per_bucket = 8  # samples per bucket per document in the conditions: 48 queries per bucket at 6 documents
cond_heads = 90  # query heads captured per condition (a uniform sample; a third of SmolLM2's, 35 MB a condition)
rope_factors = [0.5, 2.0, 4.0]  # RoPE base multipliers applied at inference
window_factors = [1, 2, 4, 8]  # windows compared, in multiples of cond_seq_len (1K-8K by default; longer than the run's windows are left out)
sinks = ["bos", "mid_document", "mask_first"]  # initial-token conditions
mask_k = 4  # keys masked at the start of every window in the mask_first condition

# %%
import time

import numpy as np
import pandas as pd

import qkplast.results.open_figures as op
from qkplast.rundir import chapter_run
from qkplast.experiments.conditions import bootstrap_parts, capture_conditions, condition_table, read_conditions
from qkplast.analysis.gqa import gqa_similarity, gqa_testable
from qkplast.analysis.listwise import listwise_summary, pairwise_predicts_listwise

started, started_cpu = time.perf_counter(), time.process_time()
run = chapter_run(run_dir, globals())  # the run's settings from its manifest (defaults for a new run), -p overrides; prints what it holds
capture, metrics = run.capture, run.metrics
opt, seed = run.options, run.analysis.seed  # the capture settings (qkplast.CaptureOptions) and the analysis seed
analysis = {k: v for k, v in run.analysis.result_key().items() if k != "seed"}
docs, heads = opt.docs, opt.heads

# %% [markdown]
# ## 1. Pairwise and listwise plasticity
#
# Write $s_i = q^\top k_i$ for the score of key $i$ under a query $q$ of bucket $b$. For a set
# $S = \{k_1, \dots, k_m\}$ of keys eligible for that bucket, let $P_i$ be the probability over the bucket's
# queries that key $i$ has the highest score in $S$.
#
# ```{prf:definition} Listwise plasticity
# :label: def-listwise-plasticity
#
# $$\mathrm{AP}_{\mathrm{set}}(S) = \frac{1 - \sum_{i=1}^m P_i^2}{1 - 1/m}.$$
#
# It is 1 when every key of the set wins equally often (the query alone decides the winner) and 0 when one key
# always wins (the winner is fixed, whatever the query). The numerator is the Gini-Simpson index of the
# winner's distribution; the denominator is its largest value.
# ```
#
# For $m = 2$ with $P_1 = p$ the numerator is $1 - p^2 - (1-p)^2 = 2p(1-p)$ and the denominator $1/2$, so
# $\mathrm{AP}_{\mathrm{set}} = 4p(1-p)$: listwise plasticity of a pair *is* the pairwise plasticity of
# Definition 4.2. The page computes, per head, query bucket and set size $m$:
#
# * `ap_set_mc` from the bucket's captured queries, with $\hat P_i$ the winning frequencies and the unbiased
#   factor $n/(n-1)$ on $1 - \sum_i \hat P_i^2$ (at $m = 2$ this is `ap_mc` exactly);
# * `ap_set` from the fitted Gaussian query model of eqs. 4.11-4.12. At $m = 2$ the winner probability has the
#   closed form $\Phi(\mu/\sqrt v)$ (eq. 4.14). For $m > 2$ the $m$ scores are jointly Gaussian with a
#   covariance of rank at most $d$, and $P_i$ is an orthant probability of $m - 1$ correlated differences
#   with no closed form; it is estimated from queries drawn from the fitted model.
#
# Sets follow the pairwise estimator's rules: $m$ distinct keys from earlier buckets of one document; the
# whole-set column takes every eligible key of a document at once, which is what softmax actually ranks
# (among the sampled positions).

# %%
m2_gaussian = float(np.nanmax(np.abs(metrics.ap_set.sel(set_size=2) - metrics.ap)))
m2_mc = float(np.nanmax(np.abs(metrics.ap_set_mc.sel(set_size=2) - metrics.ap_mc)))
print(f"m = 2 against pairwise AP, largest difference over heads and buckets below 1e-12 (rounding): "
      f"model {m2_gaussian < 1e-12}, captured queries {m2_mc < 1e-12}")
listwise_summary(metrics, n_boot=n_boot, seed=seed)

# %% [markdown]
# The table gives, for each set size, the mean over heads of each head's mean over query buckets, with a
# 95% percentile bootstrap interval over heads (`n_boot` replicates, 2000 by default). "Buckets with sets" counts
# the query buckets where a document has enough eligible keys: with a few samples per bucket and document, a
# set of 64 keys of one document only exists late in the window, so that row averages fewer, later buckets
# and is not comparable with the others bucket for bucket. The figure shows the profiles.

# %%
fig = op.listwise_profiles(metrics)

# %% [markdown]
# ### Does pairwise AP predict listwise AP across heads?
#
# If the ranking of heads by pairwise plasticity were a poor guide to how they rank whole sets, the thesis's
# comparisons between heads and models would not carry over to softmax. The Spearman correlation across heads
# of the pairwise value with the listwise value (both averaged over the buckets where the listwise value
# exists) answers it, with a bootstrap interval over heads and a permutation null (head labels of one side
# shuffled; two-sided p-value).

# %%
rows = [pairwise_predicts_listwise(metrics, int(m), n_boot=n_boot, n_perm=n_perm, seed=seed)
        for m in metrics.set_size.values if int(m) != 2 and (metrics.n_sets.sel(set_size=m) > 0).sum() >= 1]
agreement = pd.DataFrame(rows).set_index("set_size").round(4)
agreement

# %%
fig = op.pairwise_vs_listwise(metrics, 0)

# %% [markdown]
# ### How much softmax mass does position alone give the nearest keys?
#
# Plasticity says whether the query decides the order; it does not say how much weight ends up where. For a
# query of bucket $b$ in document $d$, take the softmax over $d$'s eligible keys with the attention scale
# $1/\sqrt{d_h}$ and add up the weight on the nearest eligible bucket. With *the positional term alone* the
# score of key $i$ is $(\alpha_{\mathrm{pos}} + \beta_{\mathrm{pos}}\tau_b)\,k_{i,1}$, the fitted mean of the
# query's positional coordinate times the key's (Householder basis); *full scores* use the captured queries;
# *equal scores* give each key the same weight, so the mass is the nearest bucket's share of the keys.

# %%
fig = op.nearest_mass(metrics)

# %%
near = pd.DataFrame({
    "positional term alone": metrics.nearest_mass_position.mean("head").values,
    "full scores": metrics.nearest_mass.mean("head").values,
    "equal scores": metrics.nearest_share.values,
}, index=pd.Index(metrics.query_bucket.values, name="query bucket")).round(3)
near.T

# %% [markdown]
# ## 2. Bias versus content: decomposing $\mathrm{AP}_{\mathrm{drop}}$
#
# In the Householder basis of eq. 4.10 the score difference of a key pair with difference $\delta$ splits
# into the positional coordinate and the semantic ones,
#
# $$D = \underbrace{\delta_1 q_1}_{\text{positional part}} + \underbrace{\delta_{2:d}^\top q_{2:d}}_{\text{content part}},$$
#
# and the fitted model gives each part a mean and a variance in bucket $b$: $\delta_1(\alpha_{\mathrm{pos}} +
# \beta_{\mathrm{pos}}\tau_b)$ and $\delta_1^2\sigma_{\mathrm{pos}}^2$ for the first, $\delta_{2:d}^\top\mu_b$
# and $\delta_{2:d}^\top\Sigma_b\,\delta_{2:d}$ for the second (eqs. 4.11-4.12).
#
# ```{prf:definition} Counterfactual profiles
# :label: def-counterfactual-profiles
#
# For switches $P, C \in \{0, 1\}$ let $\mathrm{AP}_b(P, C)$ be the closed-form plasticity (eq. 4.14) of
# bucket $b$, averaged over the bucket's own key pairs, under the model where
#
# * $P = 1$ keeps the positional part; $P = 0$ removes it (mean and variance);
# * $C = 1$ uses the bucket's content statistics $(\mu_b, \Sigma_b)$; $C = 0$ holds them at their context
#   average $(\bar\mu, \bar\Sigma) = \sum_b w_b(\mu_b, \Sigma_b)$ with $w_b$ the bucket's share of queries.
#
# $\mathrm{Drop}(P, C)$ is the first-20% mean minus the last-20% mean of $\mathrm{AP}_b(P, C)$, exactly as
# $\mathrm{AP}_{\mathrm{drop}}$ is formed, so $\mathrm{Drop}(1,1) = \mathrm{AP}_{\mathrm{drop}}$.
# ```
#
# ```{prf:definition} Decomposition of AP_drop
# :label: def-apdrop-decomposition
#
# $$\begin{aligned}
# \mathrm{AP}_{\mathrm{drop}}^{\mathrm{bias}} &= \mathrm{Drop}(1, 0) - \mathrm{Drop}(0, 0) && \text{the positional term alone, content held fixed,}\\
# \mathrm{AP}_{\mathrm{drop}}^{\mathrm{content}} &= \mathrm{Drop}(0, 1) && \text{the change of content statistics alone, no positional term,}\\
# \mathrm{AP}_{\mathrm{drop}}^{\mathrm{inter}} &= \mathrm{AP}_{\mathrm{drop}} - \mathrm{AP}_{\mathrm{drop}}^{\mathrm{bias}} - \mathrm{AP}_{\mathrm{drop}}^{\mathrm{content}} && \text{what neither produces alone,}
# \end{aligned}$$
#
# which add up to $\mathrm{AP}_{\mathrm{drop}}$ exactly (`ap_drop_bias`, `ap_drop_content`,
# `ap_drop_interaction`).
# ```
#
# The first-region and last-region buckets average different key pairs, so even with no positional term and
# fixed content the two regions can differ: $\mathrm{Drop}(0,0)$ (`ap_drop_keys`) measures that, and it is
# part of the content term (the keys' own semantic differences are content too). On a planted world with
# drift and constant content the content part vanishes, and with no drift and a shrinking content spread the
# bias part vanishes (tests/test_decompose.py checks both).
#
# The intervals below come from a bootstrap over documents: each replicate draws the documents with
# replacement and recomputes every bucket average over the drawn documents' key pairs, with the query model
# held at the full capture's fit (so they show the variability due to which documents supply the keys, not
# the estimation error of the query statistics).

# %%
identity = float(np.nanmax(np.abs(metrics.ap_drop_bias + metrics.ap_drop_content + metrics.ap_drop_interaction - metrics.ap_drop)))
print(f"largest |bias + content + interaction - ap_drop| over heads below 1e-12 (rounding): {identity < 1e-12}")
boot = bootstrap_parts(capture, None, n_boot=n_boot, seed=seed)
lo, hi = np.nanquantile(boot["replicates"], [0.025, 0.975], axis=0)
decomposition = pd.DataFrame({"mean over heads": boot["estimate"], "95% CI lo": lo, "95% CI hi": hi,
                              "share of heads > 0": [float((metrics[n] > 0).mean()) for n in
                                                     ("ap_drop", "ap_drop_bias", "ap_drop_content", "ap_drop_interaction", "ap_drop_keys")]},
                             index=["ap_drop", "ap_drop_bias", "ap_drop_content", "ap_drop_interaction", "ap_drop_keys"]).round(4)
decomposition

# %%
fig = op.counterfactual_profiles(metrics)

# %% [markdown]
# ## 3. What drives content decay?
#
# Section 7.6 names three candidates: the rotation of RoPE accumulating in the complement subspace,
# competition from attention sinks at the first positions, and a drift of the content features themselves.
# Each predicts something different about the content part of $\mathrm{AP}_{\mathrm{drop}}$:
#
# | condition | what changes | RoPE accumulation predicts | sink competition predicts |
# | --- | --- | --- | --- |
# | `rope_xF` | RoPE base times F at inference (slower rotation for F > 1) | content part changes with F | no change |
# | `window_L` | window of L tokens, 16 buckets each | content part grows with L | little change |
# | `bos` | a BOS token before each window | no change | changes (a sink is added) |
# | `mid_document` | windows start inside the document | no change | changes (no natural first token) |
# | `mask_first_k` | the first k keys masked in every attention call | no change | changes (the sink is removed) |
# | `baseline_reseeded` | other sampled positions, no intervention | no change | no change: the null |
#
# All conditions use the same documents (the first ones long enough for every window), one document per
# window. A scaled RoPE base is applied by rescaling the loaded model's rotary frequency buffers and restoring
# them afterwards; masking goes through the attention hook. A window equal to the run's own is cut from the
# run's capture (the heads, documents and positions a new capture would take, checked token by token) rather
# than captured again. Intervals are percentile bootstrap intervals over
# documents with the same document weights in every condition, so differences to the baseline are paired.
# With only a few documents they are coarse; the reseeded baseline shows how far two captures of the same
# setting differ with no intervention at all.

# %%
t0, t0_cpu = time.perf_counter(), time.process_time()
cond_docs = cond_docs or min(6, docs)
cond_seq_len = cond_seq_len or min(1024, opt.seq_len)
window_lengths = [int(f * cond_seq_len) for f in window_factors if f * cond_seq_len <= opt.seq_len]
if len(window_lengths) < len(window_factors):
    print(f"windows longer than the run's {opt.seq_len} tokens are left out: {[int(f * cond_seq_len) for f in window_factors if f * cond_seq_len > opt.seq_len]}")
captures, capture_seconds = capture_conditions(
    run_dir, opt, docs=cond_docs, seq_len=cond_seq_len, rope_factors=rope_factors, window_lengths=window_lengths,
    sinks=sinks, mask_k=mask_k, samples_per_bucket=cond_samples_per_bucket, heads=min(cond_heads, heads or cond_heads),
    reuse=capture)
values, differences = condition_table(captures, None, n_boot=n_boot, seed=seed)
conditions_seconds, conditions_cpu = time.perf_counter() - t0, time.process_time() - t0_cpu
table = values.pivot(index="condition", columns="quantity", values="estimate").loc[list(captures)]
table.round(3)

# %%
fig = op.condition_bars(values)

# %%
reading = read_conditions(differences, "ap_drop_content")
reading.round(4)

# %%
moved = [c for c in reading.index if reading.loc[c, "beyond_null"]]
null_size = float(reading.null_size.iloc[0])
rope_moves = [c for c in moved if c.startswith(("rope", "window"))]
sink_moves = [c for c in moved if c in ("bos", "mid_document") or c.startswith("mask_first")]
print(f"null: with no intervention (positions resampled) the content part moves by up to {null_size:.4f}")
print("conditions that move the content part beyond the null:", moved or "none")
if rope_moves and not sink_moves:
    verdict = "the data favour RoPE rotation accumulation (or a length effect) over sink competition"
elif sink_moves and not rope_moves:
    verdict = "the data favour sink competition over RoPE rotation accumulation"
elif rope_moves and sink_moves:
    verdict = "both kinds of intervention move the content part: the data do not single out one mechanism"
else:
    verdict = "no intervention moves the content part beyond the null: the data favour neither mechanism at this size"
print("reading:", verdict)

# %% [markdown]
# The reading above is computed from the table, not written in advance: a condition counts only if its paired
# interval excludes zero *and* its difference is larger than anything the reseeded baseline's interval allows
# (the same documents with other sampled positions move the content part by that much with no intervention
# at all). Two cautions. The
# bootstrap holds each condition's query model fixed, so its intervals are narrower than a full
# recomputation would give; the reseeded null is the guard against reading sampling noise as an effect. And
# the window and RoPE conditions change the positional term too, so their bias parts move as well; the content
# column is the one the mechanisms disagree about.

# %% [markdown]
# ## 4. GQA groups: coordinated or divergent?
#
# In a layer with $n_q$ query heads and $n_{kv}$ key heads, each group of $n_q/n_{kv}$ query heads reads the
# same keys (eq. 4.1). For two heads $h, h'$ of one layer let $D(h, h')$ be the root-mean-square difference of
# their plasticity profiles over query buckets. The statistic is
#
# $$T = \overline{D}_{\text{same layer, same group}} - \overline{D}_{\text{same layer, other group}},$$
#
# negative when heads of one group are more alike than heads of different groups. The null permutes the
# key-head labels among the query heads of each layer (group sizes kept, layers never mixed), which keeps the
# large differences between layers out of the comparison; the p-value is one-sided,
# $(1 + \#\{T_{\mathrm{perm}} \le T\}) / (1 + n_{\mathrm{perm}})$.

# %%
gqa, gqa_table = None, None
if gqa_testable(metrics):
    gqa = gqa_similarity(metrics, "ap", n_perm=n_perm, seed=seed)
    gqa_mc = gqa_similarity(metrics, "ap_mc", n_perm=n_perm, seed=seed)
    gqa_table = pd.DataFrame({
        "profile": ["ap (closed form)", "ap_mc (captured queries)"],
        "within group": [float(gqa.within), float(gqa_mc.within)],
        "between groups": [float(gqa.between), float(gqa_mc.between)],
        "T": [float(gqa.statistic), float(gqa_mc.statistic)],
        "null mean": [float(gqa.null_mean), float(gqa_mc.null_mean)],
        "null sd": [float(gqa.null_sd), float(gqa_mc.null_sd)],
        "p (one-sided)": [float(gqa.p_value), float(gqa_mc.p_value)],
        "layers with T < 0": [int((gqa.layer_statistic < 0).sum()), int((gqa_mc.layer_statistic < 0).sum())],
    }).set_index("profile").round(4)
else:
    print("the captured heads give no same-layer pairs within a group or none across groups: capture more heads for the GQA test")
gqa_table

# %%
fig = op.gqa_null(gqa) if gqa is not None else None

# %% [markdown]
# ## What the data leave open
#
# * Listwise plasticity is measured among the *sampled* positions of a document, a few per bucket; softmax
#   in the model competes over every position. Larger captures (more samples per bucket, longer windows)
#   reach set sizes that the default capture only has late in the window.
# * The decomposition is a statement about the fitted Gaussian model, not about the captured queries; where
#   the closed form and the Monte Carlo estimate disagree ({doc}`09_results_plasticity`), it inherits the gap.
#   Its content part also holds the keys' own semantic differences (`ap_drop_keys`), which a query-side
#   explanation of content decay does not cover.
# * The condition grid is small by default and runs on a 135M model at windows up to its trained 8K. The RoPE and window
#   conditions are inference-time changes of a model trained with one base and length; a model trained under
#   the changed setting could behave differently, which is what section 7.6 ultimately asks.
# * The GQA test says whether groups are more alike than chance within a layer; it does not say why (shared
#   keys, or query projections trained to agree).

# %% tags=["nbval-ignore-output"]
print(f"this page ran in {time.perf_counter() - started:.0f} s ({time.process_time() - started_cpu:.0f} s of CPU in this "
      f"process), of which the conditions took {conditions_seconds:.0f} s ({conditions_cpu:.0f} s of CPU; captures "
      f"{sum(capture_seconds.values()):.0f} s, 0 s for a cached condition or one cut from the run's capture: "
      f"{[c for c, cap in captures.items() if cap.attrs.get('cut_from')] or 'none'})")

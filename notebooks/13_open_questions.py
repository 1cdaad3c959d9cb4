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
# Every number below comes with an interval over **documents** (the independent unit: heads share documents
# and queries, so an interval over heads is not an interval over the data) and, where a claim is made, a
# null to compare it with.
#
# **Readings and decision rule, stated before the data.** The page decides these readings:
#
# * *listwise*: for each set size $m > 2$, "pairwise AP ranks heads as listwise AP does": Spearman's $\rho > 0$
#   across heads, against a permutation null (head labels shuffled);
# * *GQA*: "the heads of a GQA group are more alike than their shared keys make them": $T$ lies below the
#   distribution of the null that keeps every head's keys and exchanges queries within a layer (whose mean is
#   not 0: shared keys alone make a group's profiles alike). The estimate is the contrast $T$ minus the null's
#   mean. Both come from the same documents, so its interval is the policy's interval over documents of the
#   contrast itself, each capture with a document left out giving its own $T$ and its own null mean (the same
#   permutations); the null's spread enters through the p-value, the rank of $T$ among the null's draws.
#   *Amended after an earlier execution:* that execution took $T$'s interval minus the null's central 95% range,
#   which treats the null's mean as known when it is estimated from the same documents as $T$ (that interval is
#   printed beside the new one below);
# * *mechanism*: for each condition of section 3, "the intervention moves the content part of
#   $\mathrm{AP}_{\mathrm{drop}}$": its paired difference to the baseline differs from 0, against the null of many
#   reseeded baselines (no intervention).
#
# A reading is *supported* when its 95% interval lies on the predicted side of 0 (either side for "moves")
# **and** its p-value, Holm-adjusted within its family, is below 0.05 (`qkplast.stats.decision.verdict`);
# *contradicted* on the other side under the same conditions; otherwise *left open*. There are two families,
# and no verdict outside them: **listwise and GQA** (the three correlations and the GQA reading, Holm across
# the four, permutation p-values whose floor is $1/(n_\mathrm{perm} + 1)$) and **mechanism** (the content part
# under each condition, Holm across the conditions, rank p-values whose floor is $1/(n_\mathrm{reseeds} + 1)$).
# Each family prints the smallest Holm-adjusted p it can reach (the floor times its size), which must lie below
# 0.05 for its readings to be able to pass. The intervals over documents are bias-corrected jackknife-t
# intervals with $n-1$ degrees of freedom (the inference policy, whose coverage {doc}`07_corrections` shows:
# below 8 documents the corrected estimate's own standard error, from the captures with two documents left
# out), each left-out capture re-analysed whole; quantities with a range are handled on a scale that keeps the
# interval inside it (logit for means and masses in [0, 1], Fisher's z for correlations). The descriptive
# tables (listwise means, the nearest-bucket mass, the decomposition, and the conditions' effects on the
# decomposition's other parts: its baseline, drift and interaction) carry intervals and no verdict.

# %% tags=["parameters"]
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run`; its manifest holds the capture and analysis settings
n_perm = 2000  # permutations of every null on this page (the smallest p-value is 1/2001)
n_reseeds = 199  # reseeded baselines of the mechanism's null (its smallest p-value is 1/(n_reseeds + 1))
cond_docs = None  # documents of the content-decay conditions, the same in every condition (None: min(6, docs))
cond_seq_len = None  # window of the conditions' baseline, 16 buckets (None: min(1024, seq_len))
cond_samples_per_bucket = 8  # samples per bucket per document in the conditions: 48 queries per bucket at 6 documents
cond_heads = 90  # query heads captured per condition (a uniform sample; a third of SmolLM2's, 35 MB a condition)
rope_factors = [0.5, 2.0, 4.0]  # RoPE base multipliers applied at inference
window_factors = [1, 2, 8]  # windows compared, in multiples of cond_seq_len (1K, 2K, 8K by default: the 8K one is cut from the run's own capture; [1, 2, 4, 8] in a full setting; longer than the run's windows are left out)
sinks = ["bos", "mid_document", "mask_first"]  # initial-token conditions
mask_k = 4  # keys masked at the start of every window in the mask_first condition

# %%
import time

import numpy as np
import pandas as pd

import qkplast.results.extra_metrics as op
from qkplast.analysis.gqa import gqa_testable
from qkplast.stats.permutation_tests import gqa_similarity
from qkplast.experiments.condition_captures import capture_conditions, reseed_null
from qkplast.rundir import chapter_run, product_store
from qkplast.results import tables as results
from qkplast.stats.condition_readings import condition_table, describe_conditions, mechanism_reading, read_conditions
from qkplast.stats.decision import holm, verdict

started, started_cpu = time.perf_counter(), time.process_time()
run = chapter_run(run_dir, globals())  # the run's settings from its manifest (defaults for a new run), -p overrides; prints what it holds
capture, metrics = run.capture, run.metrics
opt, seed = run.options, run.analysis.seed  # the capture settings (qkplast.CaptureOptions) and the analysis seed
docs, heads = opt.docs, opt.heads
store = product_store(run_dir)  # the page's jackknives and nulls are kept in the run directory and read back

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
listwise = op.listwise_document_intervals(capture, metrics, n_perm=n_perm, seed=seed, store=store)
print(listwise.attrs["method"])
listwise.drop(columns=[c for c in listwise.columns if c.startswith(("rho", "p_perm"))]
              + ([] if listwise.reason.astype(bool).any() else ["reason"])).round(3)

# %% [markdown]
# The table gives, for each set size, the mean over heads of each head's mean over query buckets, with a
# 95% interval over documents (the policy's). "Buckets with sets" counts
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
# exists) answers it, with the policy's interval over documents and a permutation null (head labels of one
# side shuffled; two-sided p-value). Its verdicts are decided with the GQA reading below (one Holm family).
# The interval's ends are shown to two decimals: they move in the fourth with the CPU the capture was made on
# (a captured query whose two best keys nearly tie changes winner with the last bits of the float32 products,
# and the jackknife carries it: m = 8's lower end is 0.6520 from a capture made on an AMD EPYC, 0.6517 from one
# made on an Intel Xeon), and the page reads the same on any x86-64 machine. The verdicts take the unrounded ends.

# %%
agreement = listwise[["rho", "rho lo", "rho hi", "p_perm"]].dropna(subset=["rho"])
agreement.round({"rho": 4, "rho lo": 2, "rho hi": 2, "p_perm": 4})

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
near = op.nearest_mass_intervals(metrics)
print(near.attrs["method"])
near.dropna(how="all").round(3)

# %% [markdown]
# ## 2. Drift versus content: decomposing $\mathrm{AP}_{\mathrm{drop}}$
#
# The fitted model (eqs. 4.10-4.12) gives the score difference $D = q^\top\delta$ of a key pair
# $\delta = k_i - k_j$ in query bucket $b$ the mean $m_b^\top\delta$ and the variance $\delta^\top\Sigma_b\delta$.
# Everything in it that moves with position is a **mean drift**, from two sources: the queries' drift (eq.
# 4.10 puts it on coordinate 1 of the Householder basis, $m_{b,1} = \alpha_{\mathrm{pos}} + \beta_{\mathrm{pos}}\tau_b$) and the
# keys' own drift $\beta_K$, in every coordinate, on the drift axis or off it, which makes
# $\delta = \beta_K(t_i - t_j) + (r_i - r_j)$ with $r$ the keys' residual. Everything else is **content**: the
# query statistics of each bucket around the drift (means, every variance) and the keys' residual
# differences.
#
# ```{prf:definition} Counterfactual profiles
# :label: def-counterfactual-profiles
#
# For switches $P, C \in \{0, 1\}$ let $\mathrm{AP}_b(P, C)$ be the closed-form plasticity (eq. 4.14) of bucket $b$,
# averaged over the bucket's own key pairs with the estimator's weights, under the model where
#
# * $P = 1$ keeps both drifts; $P = 0$ removes them: the query mean is held at its context-average level
#   along the drift ($\beta_{\mathrm{pos}}(\tau_b - \bar\tau)$ taken out of $m_b$) and the keys lose theirs,
#   $\delta \to \delta - \beta_K(t_i - t_j)$;
# * $C = 1$ uses the bucket's own content statistics; $C = 0$ holds them at their context average (the
#   query-count-weighted mean over buckets of the drift-free mean and of $\Sigma_b$).
#
# $\mathrm{Drop}(P, C)$ is the first-20% mean minus the last-20% mean of $\mathrm{AP}_b(P, C)$, exactly as
# $\mathrm{AP}_{\mathrm{drop}}$ is formed, so $\mathrm{Drop}(1,1) = \mathrm{AP}_{\mathrm{drop}}$.
# ```
#
# ```{prf:definition} Decomposition of AP_drop
# :label: def-apdrop-decomposition
#
# $$\begin{aligned}
# \mathrm{AP}_{\mathrm{drop}}^{\mathrm{baseline}} &= \mathrm{Drop}(0, 0),\\
# \mathrm{AP}_{\mathrm{drop}}^{\mathrm{bias}} &= \mathrm{Drop}(1, 0) - \mathrm{Drop}(0, 0),\\
# \mathrm{AP}_{\mathrm{drop}}^{\mathrm{content}} &= \mathrm{Drop}(0, 1) - \mathrm{Drop}(0, 0),\\
# \mathrm{AP}_{\mathrm{drop}}^{\mathrm{inter}} &= \mathrm{Drop}(1, 1) - \mathrm{Drop}(1, 0) - \mathrm{Drop}(0, 1) + \mathrm{Drop}(0, 0):
# \end{aligned}$$
#
# neither drift nor changing content; the drifts alone, content held fixed; the change of content statistics alone;
# and what the two add together. They add up to $\mathrm{AP}_{\mathrm{drop}}$ exactly (`ap_drop_baseline`,
# `ap_drop_bias`, `ap_drop_content`, `ap_drop_interaction`).
# ```
#
# The baseline is reported on its own: it is what the first and last regions differ by with no drift and
# fixed content, because their key pairs come from different key sets. An earlier version of this page
# kept only the query-drift coordinate as positional: key drift off that axis then fell into "content", and
# the baseline was counted inside the content part. On planted worlds where only the keys drift off the
# query's axis the drift part now takes the whole drop, and where only the content spread shrinks the content
# part does (`tests/unit/analysis/test_decompose.py`).

# %%
identity = float(np.nanmax(np.abs(sum(metrics[n] for n in ("ap_drop_baseline", "ap_drop_bias", "ap_drop_content",
                                                            "ap_drop_interaction")) - metrics.ap_drop)))
print(f"largest |baseline + bias + content + interaction - ap_drop| over heads below 1e-12 (rounding): {identity < 1e-12}")
decomposition = results.decomposition_table(capture, metrics, store=store)
print(decomposition.attrs["method"])
decomposition.round(4)

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
#
# All conditions use the same documents (the first ones long enough for every window), one document per
# window. A scaled RoPE base is applied by rescaling the loaded model's rotary frequency buffers and restoring
# them afterwards; masking goes through the attention hook. A window equal to the run's own is cut from the
# run's capture (checked token by token) rather than captured again, and the baseline from the capture at every
# position below (the positions its seed samples: the same values as a capture of its own).
#
# **Intervals and the null.** A condition's difference to the baseline is paired by document; its interval is
# the policy's interval over documents, both captures re-analysed with each document left out. The null is the
# baseline with no intervention and other sampled positions: `n_reseeds` reseeded baselines, each cut from
# one capture of the baseline at every position (exactly what a capture with that seed samples). A
# condition's p-value is the rank of its difference's size among the reseeded differences (two-sided), its
# floor $1/(n_\mathrm{reseeds} + 1)$; Holm's correction runs across the conditions.

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
values, differences = condition_table(captures, None, store=store)
null = reseed_null(captures["all_positions"], captures["baseline"], n_reseeds, store=store)
conditions_seconds, conditions_cpu = time.perf_counter() - t0, time.process_time() - t0_cpu
shown = [c for c in captures if c != "all_positions"]
print(f"{len(shown) - 1} conditions on {values.attrs['documents']} documents; null: {len(null)} reseeded baselines")
values.pivot(index="condition", columns="quantity", values="estimate").loc[shown].round(3)

# %%
fig = op.condition_bars(values[values.condition.isin(shown)])

# %% [markdown]
# The null: how far each part moves with no intervention (reseeded positions), as a 5-95% range:

# %%
null.quantile([0.05, 0.5, 0.95]).T.round(4)

# %%
reading = read_conditions(differences, null, "ap_drop_content")
print(f"mechanism family: content part; null of {reading.attrs['n_null']} reseeded baselines, rank p floor "
      f"{reading.attrs['floor']:.4f}; Holm across {len(reading)} conditions, smallest reachable Holm p "
      f"{reading.attrs['holm_floor']:.4f} (a reading can pass: {reading.attrs['can_pass']})")
reading.round(4)

# %%
print("reading of section 7.6:", mechanism_reading(reading))

# %% [markdown]
# The decomposition's other parts under the same conditions are described, not decided (no family was declared
# for them): each difference with its interval and the share of the reseeded baselines at least as far from 0,
# not corrected for the number of comparisons.

# %%
others = describe_conditions(differences, null, ("ap_drop_baseline", "ap_drop_bias", "ap_drop_interaction"))
others.round(4)

# %% [markdown]
# The window conditions also change the positional term, so their drift parts can move too; the content column
# is the one the mechanisms disagree about. The query model is re-fitted in every left-out capture, so the
# intervals carry the estimation error of the query statistics as well as the documents'.

# %% [markdown]
# ## 4. GQA groups: coordinated or divergent?
#
# In a layer with $n_q$ query heads and $n_{kv}$ key heads, each group of $n_q/n_{kv}$ query heads reads the
# same keys (eq. 4.1). For two heads $h, h'$ of one layer let $D(h, h')$ be the root-mean-square difference of
# their plasticity profiles over query buckets. The statistic is
#
# $$T = \overline{D}_{\text{same layer, same group}} - \overline{D}_{\text{same layer, other group}},$$
#
# negative when heads of one group are more alike than heads of different groups. Two nulls:
#
# * *labels permuted*: the key-head labels are permuted among the query heads of each layer. But the heads
#   of a group share their key pairs, so their profiles are partly alike whatever their queries do; this
#   null counts that as coordination;
# * *keys kept*: every head keeps its own keys and the **queries** are exchanged among the heads of the
#   layer: head $h$ gets the profile of query head $\pi(h)$ scored against $h$'s keys
#   (`qkplast.stats.permutation_tests.gqa_key_null`). What survives this null is coordination beyond the shared keys,
#   the reading decided here.
#
# The p-value is one-sided, $(1 + \#\{T_{\mathrm{null}} \le T\}) / (1 + n_{\mathrm{perm}})$; $T$ gets the policy's
# interval over documents. The reading is decided against the keys-kept null's distribution: `contrast` is $T$
# minus that null's mean, its interval over documents with each left-out capture's own null mean; `key null lo`
# and `key null hi` are the null's central 95% range, shown in the figure below.

# %%
gqa_result = None
if gqa_testable(metrics):
    gqa_result = op.gqa_reading(capture, metrics, n_perm=n_perm, seed=seed, store=store)
    gqa = gqa_similarity(metrics, "ap", n_perm=n_perm, seed=seed)
    print(gqa_result.attrs["method"])
    g = gqa_result.iloc[0]
    print(f"the earlier execution's interval (T's minus the null's central 95% range): "
          f"[{g['T lo'] - g['key null hi']:.4f}, {g['T hi'] - g['key null lo']:.4f}]")
else:
    print("the captured heads give no same-layer pairs within a group or none across groups: capture more heads for the GQA test")
gqa_result.round(4) if gqa_result is not None else None

# %%
fig = op.gqa_null(gqa, gqa_result.attrs["key_null"]) if gqa_result is not None else None

# %% [markdown]
# ### The listwise and GQA readings, decided
#
# One Holm family: $\rho > 0$ for each set size (permutation p) and $T$ below the null that keeps the keys (the
# contrast to its mean with its interval over documents; rank p among its draws).

# %%
family = [{"reading": f"pairwise AP ranks heads as listwise AP does (m = {m})", "claim": "greater",
           "estimate": float(r.rho), "lo": float(r["rho lo"]), "hi": float(r["rho hi"]), "p": float(r.p_perm)}
          for m, r in agreement.iterrows()]
if gqa_result is not None:
    g = gqa_result.iloc[0]
    family.append({"reading": "heads of a GQA group are more alike than their shared keys make them", "claim": "less",
                   "estimate": float(g["contrast"]), "lo": float(g["contrast lo"]), "hi": float(g["contrast hi"]),
                   "p": float(g["p (keys kept)"])})
family = pd.DataFrame(family)
print(f"listwise and GQA family: {len(family)} readings, permutation p floor {1 / (n_perm + 1):.5f}, smallest "
      f"reachable Holm p {len(family) / (n_perm + 1):.4f}")
family["p (Holm)"] = holm(family.p.to_numpy())
family["verdict"] = [verdict(e, lo, hi, p, claim=c) for e, lo, hi, p, c in
                     zip(family.estimate, family.lo, family.hi, family["p (Holm)"], family.claim)]
shown = family.copy()
listwise_rows = shown.reading.str.startswith("pairwise AP")
shown.loc[listwise_rows, ["lo", "hi"]] = shown.loc[listwise_rows, ["lo", "hi"]].round(2)  # as above: two decimals
shown.set_index("reading").round(4)

# %% [markdown]
# ## What the data leave open
#
# * Listwise plasticity is measured among the *sampled* positions of a document, a few per bucket; softmax
#   in the model competes over every position. Larger captures (more samples per bucket, longer windows)
#   reach set sizes that the default capture only has late in the window.
# * The decomposition is a statement about the fitted Gaussian model, not about the captured queries; where
#   the closed form and the Monte Carlo estimate disagree ({doc}`09_results_plasticity`), it inherits the gap.
#   Its drift part holds *linear* drifts (of queries and keys); a mean that moves with position in a curve
#   counts as content.
# * The condition grid is small by default and runs on a 135M model at windows up to its trained 8K. The RoPE and window
#   conditions are inference-time changes of a model trained with one base and length; a model trained under
#   the changed setting could behave differently, which is what section 7.6 ultimately asks.
# * The GQA test with the keys kept says whether groups are more alike than their shared keys make them; it
#   does not say why (query projections trained to agree, or inputs the group's heads read alike).

# %% tags=["nbval-ignore-output"]
print(f"this page ran in {time.perf_counter() - started:.0f} s ({time.process_time() - started_cpu:.0f} s of CPU in this "
      f"process), of which the conditions took {conditions_seconds:.0f} s ({conditions_cpu:.0f} s of CPU; captures "
      f"{sum(capture_seconds.values()):.0f} s, 0 s for a cached condition or one cut from another capture: "
      f"{[c for c, cap in captures.items() if cap.attrs.get('cut_from')] or 'none'})")

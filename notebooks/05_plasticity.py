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
# # Attention plasticity
#
# The rotation model measures how much position enters the score. Whether that decides *which key wins*
# depends on the content signal too. Attention plasticity (thesis section 4.4) asks the question directly:
# for two keys already in the context, does the order of their scores depend on the query, or is it fixed
# by their positions?
#
# Fix a head and a prefix $x_{1:n}$ of a document. Its keys $k_1, \dots, k_n$ are then fixed. A query at a
# later position $t > n$ depends on tokens not yet seen, so, seen from the prefix, $q_t$ is random, drawn
# from the workload.
#
# ```{prf:definition} Pairwise preference
# :label: def-pairwise-preference
#
# For a prefix $x_{1:n}$, a query position $t > n$ and key indices $i < j \le n$, the pairwise preference
# is $p = \Pr_{q_t}\!\left[q_t^\top k_i > q_t^\top k_j\right]$ (eq. 4.7).
# ```
#
# ```{prf:definition} Pairwise plasticity
# :label: def-pairwise-plasticity
#
# The pairwise plasticity is $\mathrm{PP} = 4p(1-p)$ (eq. 4.8), four times the variance of the Bernoulli
# indicator of the event in {prf:ref}`def-pairwise-preference`. It is 1 when the query decides the order
# ($p = 1/2$) and tends to 0 when the order is fixed whatever the query ($p \to 0$ or $1$).
# ```
#
# ```{prf:definition} Attention plasticity
# :label: def-attention-plasticity
#
# The attention plasticity at query position $t$ is $\mathrm{AP}_t = \mathbb{E}\,[\mathrm{PP}]$ over a prefix
# length $N$ uniform on $\{1, \dots, t-1\}$, a prefix $X_{1:N}$ from the workload, and a key pair uniform
# among the admissible ones (eq. 4.9). The map $t \mapsto \mathrm{AP}_t$ is the head's plasticity profile.
# ```
#
# ## A basis where position sits on one coordinate
#
# Let $\beta \in \mathbb{R}^d$ hold the least-squares slopes of the query coordinates on position,
# $\beta_j = \operatorname{Cov}(q_j, t)/\operatorname{Var}(t)$, and $\hat\beta = \beta/\lVert\beta\rVert$.
#
# ```{prf:proposition} Householder decomposition
# :label: prop-householder
#
# With $u = \hat\beta - e_1 \neq 0$, the reflection $H = I - 2uu^\top/\lVert u\rVert^2$ is symmetric and
# orthogonal, maps $\hat\beta$ to $e_1$ (eq. 4.10), and preserves every score:
# $q^\top k = (Hq)^\top(Hk)$. In the rotated basis the slopes of the queries on position are
# $H\beta = \lVert\beta\rVert e_1$: coordinate 1 carries all the linear position dependence of the queries
# (slope $\beta_{\text{pos}} = \lVert\beta\rVert$), and coordinates $2, \dots, d$ have none.
# ```
#
# ```{prf:proof}
# $H^\top = H$ and $H^2 = I - 4uu^\top/\lVert u\rVert^2 + 4u(u^\top u)u^\top/\lVert u\rVert^4 = I$, so $H$ is an
# orthogonal involution and $(Hq)^\top(Hk) = q^\top H^2 k = q^\top k$. Since $\lVert\hat\beta\rVert = \lVert e_1\rVert$,
# $u^\top\hat\beta = 1 - \hat\beta_1 = \tfrac12\lVert u\rVert^2$, hence
# $H\hat\beta = \hat\beta - u = e_1$. Slopes are linear in the data, so the slopes of $Hq$ are $H\beta$.
# ```
#
# Numerically the first entry of $u$, $\hat\beta_1 - 1$, cancels when $\hat\beta$ is close to $e_1$.
# `qkplast.linalg` computes it as $-\sum_{j>1}\hat\beta_j^2/(1 + \hat\beta_1)$, which has no cancellation,
# and takes $H = I$ at $\hat\beta = e_1$; the tests compare both forms near $e_1$.
#
# ## The Gaussian closed form
#
# In the rotated basis the query at position $t$ is modelled as
# $q^{\text{rot}}_1 = \alpha_{\text{pos}} + \beta_{\text{pos}} t + \varepsilon$ with residual variance
# $\sigma^2_{\text{pos}}$, and $q^{\text{rot}}_{2:d}$ with the mean $\mu_b$ and variances $\sigma_b^2$ of the
# queries in the query's position bucket $b$. For a key pair let $\delta = H k_i - H k_j$ and
# $D = q^\top(k_i - k_j) = \delta^\top q^{\text{rot}}$. Replacing $t$ by the bucket's representative position
# $\tau_q$,
#
# $$
# \mu = \delta_1(\alpha_{\text{pos}} + \beta_{\text{pos}}\tau_q) + \delta_{2:d}^\top \mu_b, \qquad
# v = \delta_1^2\sigma^2_{\text{pos}} + \delta_{2:d}^\top \operatorname{diag}(\sigma_b^2)\,\delta_{2:d}
# \qquad \text{(eqs. 4.11-4.12)},
# $$
#
# and then:
#
# ```{prf:proposition} Gaussian closed form
# :label: prop-gaussian-closed-form
#
# If $D \sim \mathcal N(\mu, v)$ with $v > 0$ ({prf:ref}`lemma-a1` in {doc}`06_theory` gives the conditions), then
#
# $$
# p = \Phi\!\left(\mu/\sqrt{v}\right), \qquad \mathrm{PP} = 4\,\Phi(z)\,\Phi(-z), \quad z = \mu/\sqrt{v}
# \qquad \text{(eqs. 4.13-4.14)}.
# $$
# ```
#
# ```{prf:proof}
# $q^\top k_i > q^\top k_j$ is the event $D > 0$. With $Z = (D - \mu)/\sqrt{v}$ standard normal,
# $\Pr[D > 0] = \Pr[Z > -z] = 1 - \Phi(-z) = \Phi(z)$ by the symmetry of $\Phi$. Then
# $\mathrm{PP} = 4p(1-p) = 4\Phi(z)(1 - \Phi(z)) = 4\Phi(z)\Phi(-z)$.
# ```
#
# The product form matters: with $p = \Phi(z)$ rounded to 1 for $z \gtrsim 8.3$, $4p(1-p)$ returns 0
# where $4\Phi(z)\Phi(-z)$ keeps full relative precision (and $\Phi$ itself is taken from `erfc`, since
# `torch.special.ndtr` loses the lower tail).
#
# **Aggregation** (section 4.4.5). For each query bucket, key pairs are drawn from the keys of earlier
# buckets of one document; their plasticity is averaged into $\mathrm{AP}$ per bucket. $\mathrm{AP}_{\text{overall}}$
# weights buckets by their width, $\mathrm{AP}_{\text{first }20\%}$ and $\mathrm{AP}_{\text{last }20\%}$ average the
# buckets whose $\tau_q$ lies in the first and last fifth of the window, and
# $\mathrm{AP}_{\text{drop}}$ is their difference. Each of these choices is an option of
# `qkplast.AnalysisOptions`; the defaults follow the thesis text.
#
# **A check without the Gaussian assumption.** For the same pairs, `ap_mc` counts the share $\hat p$ of
# the bucket's captured queries that prefer $k_i$ and reports $4\hat p(1-\hat p)\,n/(n-1)$, the unbiased
# estimate of $4p(1-p)$ from $n$ queries.

# %% tags=["parameters"]
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run`; its manifest holds the capture and analysis settings

# %%
import numpy as np
import pandas as pd

import qkplast.plots as qp
from qkplast.batch import load_run

run = load_run(run_dir, globals())  # settings from the run's manifest (defaults for a new run); papermill -p overrides
capture, metrics, notes = run.capture, run.metrics, run.notes
print(f"{metrics.sizes['head']} heads of {capture.attrs['model']}")
for note in notes:
    print("note:", note)

# %% [markdown]
# ## The plasticity profile
#
# Bucket 0 has no earlier bucket, hence no key pairs, and no plasticity: the note above says so.

# %%
profile = pd.DataFrame({
    "tau": metrics.tau.values, "queries": metrics.n_queries.values, "pairs": metrics.n_pairs.values,
    "AP closed form": metrics.ap.mean("head").values, "AP Monte Carlo": metrics.ap_mc.mean("head").values,
}).set_index("tau").round(3)
profile

# %%
fig = qp.plasticity_profile(metrics)

# %% [markdown]
# ## Quintiles and the aggregates
#
# In the layout of Table 6.1 of the thesis: mean plasticity over heads for query positions in each fifth
# of the window, then the aggregates.

# %%
quintiles = pd.DataFrame(
    [metrics.ap_context.mean("head").values, metrics.ap_context_mc.mean("head").values],
    index=["closed form", "Monte Carlo"],
    columns=[f"{int(100 * lo)}-{int(100 * hi)}%" for lo, hi in zip(metrics.context_lo.values, metrics.context_hi.values)],
)
for name in ("ap_overall", "ap_first20", "ap_last20", "ap_drop"):
    quintiles[name] = [float(metrics[name].mean()), float(metrics[f"{name}_mc"].mean())]
quintiles.round(3)

# %% [markdown]
# The thesis's claim for every model it examined: plasticity falls from the first to the last fifth of the
# context.

# %%
print(f"mean AP_drop {float(metrics.ap_drop.mean()):.3f}: plasticity falls across the context: "
      f"{float(metrics.ap_drop.mean()) > 0}; AP_drop > 0 in {100 * float((metrics.ap_drop > 0).mean()):.0f}% of heads")

# %% [markdown]
# ## Two distances
#
# Every key pair also has an inter-key distance $|t_i - t_j|$ and a distance from the query to the pair's
# midpoint $\tau_q - (t_i + t_j)/2$. Binning plasticity by both shows what the 1D profile averages away.

# %%
fig = qp.plasticity_map(metrics)

# %% [markdown]
# ## Closed form against Monte Carlo
#
# Where the two agree, the Gaussian closed form is a fair summary of the captured queries; where they
# disagree, the score differences are not Gaussian or the bucket model (a linear positional term and a
# diagonal semantic covariance) misses structure.

# %%
diff = (metrics.ap - metrics.ap_mc).values
print(f"mean |closed form - Monte Carlo| over heads and buckets: {np.nanmean(np.abs(diff)):.3f}; "
      f"correlation {pd.Series(metrics.ap.values.ravel()).corr(pd.Series(metrics.ap_mc.values.ravel())):.3f}")
fig = qp.closed_vs_monte_carlo(metrics)

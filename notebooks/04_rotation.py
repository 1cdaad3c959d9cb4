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
# # The planar rotation model
#
# PCA finds the directions of largest variance, whatever they mean. The rotation model of thesis
# section 4.3 instead builds two directions with a guaranteed meaning: one holds all the linear position
# covariance of the pooled query-key cloud, the other the offset between the query and key centroids.
# Throughout, $x$ ranges over the pooled cloud (every captured query and key of the head), $t$ is the
# token position of each point, $\mu_Q$ and $\mu_K$ are the query and key centroids, and
# $c = \operatorname{Cov}(x, t) \in \mathbb{R}^d$ is the vector of covariances of each coordinate with
# position.
#
# ```{prf:definition} Drift axis
# :label: def-drift-axis
#
# The drift axis of a head is the unit vector $a$ maximising the covariance of the projection with position,
# $a = \arg\max_{\lVert u\rVert = 1} \operatorname{Cov}(u^\top x, t)$ (eq. 4.2).
# ```
#
# ```{prf:proposition} Closed form of the drift axis
# :label: prop-drift-axis
#
# If $c \neq 0$, the drift axis is $a = c / \lVert c\rVert$ (eq. 4.3), and every unit vector
# $u \perp a$ has $\operatorname{Cov}(u^\top x, t) = 0$.
# ```
#
# ```{prf:proof}
# Covariance is linear in each argument, so $\operatorname{Cov}(u^\top x, t) = u^\top c$. By the
# Cauchy-Schwarz inequality $u^\top c \le \lVert u\rVert\,\lVert c\rVert = \lVert c\rVert$ for unit $u$,
# with equality exactly when $u$ is the positive multiple $c/\lVert c\rVert$ of $c$. For $u \perp a$,
# $u^\top c = \lVert c\rVert\, u^\top a = 0$.
# ```
#
# ```{prf:definition} Separation axis
# :label: def-separation-axis
#
# The separation axis is the unit vector orthogonal to $a$ along which the centroids differ most,
# $b = \arg\max_{\lVert u\rVert = 1,\; u \perp a} (\mu_Q - \mu_K)^\top u$ (eq. 4.4).
# ```
#
# ```{prf:proposition} Closed form of the separation axis
# :label: prop-separation-axis
#
# Let $\Delta = \mu_Q - \mu_K$ and $P = I - a a^\top$. If $P\Delta \neq 0$, then
# $b = P\Delta / \lVert P\Delta\rVert$ (eq. 4.5), and the maximum is $\lVert P\Delta\rVert$, which we
# report as `separation_strength`.
# ```
#
# ```{prf:proof}
# For $u \perp a$ we have $Pu = u$, hence $\Delta^\top u = \Delta^\top P u = (P\Delta)^\top u$, because $P$ is
# symmetric. Cauchy-Schwarz bounds this by $\lVert P\Delta\rVert$, with equality only at
# $u = P\Delta/\lVert P\Delta\rVert$, which is itself orthogonal to $a$ since $a^\top P = 0$.
# ```
#
# ```{prf:proposition} Bias strength
# :label: prop-bias-strength
#
# Split every score as $q^\top k = (q^\top a)(k^\top a) + q^\top P k$. Let the keys' projections on $a$
# follow the least-squares line $k^\top a \approx \alpha_K t_k + \kappa$ in the key position $t_k$, and
# let $\mu_Q^a$ be the mean query projection on $a$. Then the mean contribution of the drift axis to the
# score of a key at position $t_k$ is $\mu_Q^a(\alpha_K t_k + \kappa)$, which changes with the key's
# position at the rate
#
# $$
# \mathrm{bias\_strength} = \mu_Q^a \, \alpha_K \qquad \text{(eq. 4.6)}.
# $$
# ```
#
# ```{prf:proof}
# Averaging $(q^\top a)(k^\top a)$ over queries with the key fixed gives $\mu_Q^a\,(k^\top a)$; replacing
# $k^\top a$ by its fitted line gives $\mu_Q^a(\alpha_K t_k + \kappa)$, whose derivative in $t_k$ is
# $\mu_Q^a \alpha_K$. The term $q^\top P k$ carries no linear position covariance of the pooled cloud
# ({prf:ref}`prop-drift-axis`), so the linear, absolute-position part of the score sits on $a$.
# ```
#
# A positive bias strength therefore raises the scores of keys at *larger* positions, the ones closest to
# a later query: a recency bias. (Section 4.3 of the thesis glosses the nearer keys as "smaller position
# values"; the derivation says larger. {doc}`07_corrections` checks this on the captured heads.)

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

# %% [markdown]
# ## All linear position covariance lies on $a$
#
# {prf:ref}`prop-drift-axis` is exact, so numerically the covariance of any direction orthogonal to $a$
# with position must vanish up to rounding. `orthogonal_position_cov` measures it from the data: the
# pooled cloud is projected off $a$ and the norm of the projection's covariance with position is taken,
# which is the largest covariance any unit direction orthogonal to $a$ can have. The thesis reports
# $7.3\times10^{-15}$.

# %%
relative = (metrics.orthogonal_position_cov / metrics.position_cov_a).values
print(f"largest orthogonal covariance, relative to the covariance along a: {relative.max():.1e}")
assert relative.max() < 1e-12
assert (abs((metrics.axis_a * metrics.axis_b).sum("dim")) < 1e-12).all(), "a and b must be orthogonal"

# %% [markdown]
# ## Keys carry the position signal
#
# On PC0 queries looked more positional than keys. On the drift axis the order reverses: the thesis finds
# $|r_k^{(a)}| \approx 0.87 > |r_q^{(a)}| \approx 0.74$ (section 6.1.2). PC0 had mixed the Q/K centroid offset
# into the position gradient; $a$ separates them by construction.

# %%
reversal = pd.Series({
    "mean |r_q| on PC0": float(abs(metrics.r_q_pc[:, 0]).mean()),
    "mean |r_k| on PC0": float(abs(metrics.r_k_pc[:, 0]).mean()),
    "mean |r_q| on a": float(abs(metrics.r_q_a).mean()),
    "mean |r_k| on a": float(abs(metrics.r_k_a).mean()),
    "share of variance in the {a, b} plane": float(metrics.plane_variance_fraction.mean()),
}).round(3)
print(f"keys more positional than queries on a, as in the thesis: "
      f"{reversal['mean |r_k| on a'] > reversal['mean |r_q| on a']}")
reversal

# %%
fig = qp.axis_reversal(metrics)

# %% [markdown]
# ## One head in its plane
#
# The head with the largest bias strength, projected on $a$ (horizontal) and $b$ (vertical): position
# spreads the points along $a$, the Q/K offset separates them along $b$.

# %%
top = int(np.argmax(metrics.bias_strength.values))
fig = qp.ab_plane(capture, metrics, top)

# %% [markdown]
# ## Bias strength across heads
#
# The thesis finds positive bias strength in 99.0% of 3,239 heads (section 6.1.2).

# %%
share_positive = float((metrics.bias_strength > 0).mean())
print(f"{100 * share_positive:.1f}% of {metrics.sizes['head']} heads have positive bias strength; "
      f"median {float(metrics.bias_strength.median()):.3g}")
fig = qp.bias_distribution(metrics)

# %%
fig = qp.bias_vs_separation(metrics)

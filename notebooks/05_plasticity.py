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
# **Two departures of the estimator from this definition** (both measured below, in
# {ref}`sec-departures`):
#
# - *Pair weighting.* Under Definition 4.3 a pair whose later key sits at position $j$ enters every prefix of
#   length $N \ge j$, each with probability $\frac{1}{t-1}\binom{N}{2}^{-1}$, so its weight is
#   $\sum_{N=j}^{t-1}\frac{2}{(t-1)N(N-1)} = \frac{2}{t-1}\big(\frac{1}{j-1} - \frac{1}{t-1}\big)$: pairs of early keys
#   weigh far more. The thesis's estimator (section 4.4.5) draws pairs uniformly from the keys of earlier
#   buckets. The two estimate different quantities; `AnalysisOptions(pair_weight="prefix")` gives the
#   definition's weighting (as importance weights on the uniformly drawn pairs).
# - *Pooled queries.* Definition 4.1 takes the probability over queries *given the prefix*, i.e. given the
#   document; the closed form estimates the query mean and variance per position bucket pooled over all
#   documents. Document-to-document variation then counts as query randomness and raises plasticity.
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
# `qkplast.analysis.linalg` computes it as $-\sum_{j>1}\hat\beta_j^2/(1 + \hat\beta_1)$, which has no cancellation,
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
# If $D \sim \mathcal N(\mu, v)$ with $v > 0$, then
#
# $$
# p = \Phi\!\left(\mu/\sqrt{v}\right), \qquad \mathrm{PP} = 4\,\Phi(z)\,\Phi(-z), \quad z = \mu/\sqrt{v}
# \qquad \text{(eqs. 4.13-4.14)}.
# $$
#
# Under assumptions A.1-A.2 ({doc}`06_theory`), {prf:ref}`lemma-a1` gives $D \sim \mathcal N(\mu, v_{\text{full}})$
# with $v_{\text{full}} = \delta_1^2\sigma^2_{\text{pos}} + \delta_{2:d}^\top\Sigma_b\,\delta_{2:d}$. The $v$ of eq. 4.12
# equals it only when $\delta_{2:d}^\top\big(\Sigma_b - \operatorname{diag}(\sigma_b^2)\big)\delta_{2:d} = 0$, in
# particular when $\Sigma_b$ is **diagonal** in the rotated basis; that is the assumption under which
# eqs. 4.12-4.14 follow from the lemma. Without it, the proposition holds with $v = v_{\text{full}}$
# (`covariance="full"`).
# ```
#
# ```{prf:proof}
# $q^\top k_i > q^\top k_j$ is the event $D > 0$. With $Z = (D - \mu)/\sqrt{v}$ standard normal,
# $\Pr[D > 0] = \Pr[Z > -z] = 1 - \Phi(-z) = \Phi(z)$ by the symmetry of $\Phi$. Then
# $\mathrm{PP} = 4p(1-p) = 4\Phi(z)(1 - \Phi(z)) = 4\Phi(z)\Phi(-z)$. For the second part, $v_{\text{full}} - v =
# \delta_{2:d}^\top\Sigma_b\delta_{2:d} - \sum_m \Sigma_{b,mm}\delta_m^2 = \sum_{m \ne n}\Sigma_{b,mn}\delta_m\delta_n$, which
# vanishes for every $\delta$ exactly when $\Sigma_b$ is diagonal.
# ```
#
# The thesis itself is inconsistent here: its statement of Lemma A.1 gives the diagonal variance of
# eq. 4.12, while its proof computes $\delta_{2:d}^\top\Sigma_b\delta_{2:d}$. The diagonal is also basis-dependent
# (coordinates $2..d$ are fixed only up to a rotation); {doc}`07_corrections` measures both effects.
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
# `qkplast.AnalysisOptions`; the defaults follow the thesis text. Note that the two edges need not average
# the same number of buckets: bucket 0 has no earlier keys, so the first fifth loses one bucket (the counts
# for this run are printed in {ref}`sec-departures`), and its average is the noisier of the two.
#
# **A check without the Gaussian assumption.** For the same pairs, `ap_mc` counts the share $\hat p$ of
# the bucket's captured queries that prefer $k_i$ and reports $4\hat p(1-\hat p)\,n/(n-1)$, the unbiased
# estimate of $4p(1-p)$ from $n$ queries. Its Monte Carlo standard error over the pair draw is `ap_mc_se`
# (the pairs of one bucket share its queries, so the part of the error due to the finite set of queries is
# not in it).

# %% tags=["parameters"]
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run`; its manifest holds the capture and analysis settings
example_head = 0  # position along `head` of the head whose first pair is computed by hand

# %%
import warnings
from dataclasses import replace

import numpy as np
import pandas as pd
from scipy.stats import norm

import qkplast
import qkplast.results.figures as qp
from qkplast.results import tables as results
from qkplast.rundir import chapter_run
from qkplast.analysis.pairs import sample_key_pairs
from qkplast.analysis.plasticity import PlasticityWarning, pair_statistics, plasticity

run = chapter_run(run_dir, globals())  # the run's settings from its manifest (defaults for a new run), -p overrides; prints what it holds
capture, metrics = run.capture, run.metrics
seed, analysis = run.analysis.seed, run.analysis  # the run's AnalysisOptions, passed whole

# %% [markdown]
# ## One pair by hand
#
# Every step of the closed form for one key pair of one head, from the raw captured vectors with plain
# numpy, beside the value the library computes (thesis defaults; the pair is the first one the library
# drew for the last query bucket). The two must agree to rounding.

# %%
h = example_head
ps = pair_statistics(capture, heads=[h], seed=seed)  # the library's terms, thesis defaults
b = int(ps.query_bucket[-1])  # the last query bucket
pairs = sample_key_pairs(capture, qkplast.AnalysisOptions(seed=seed))  # the same pairs the library drew
i, j = int(pairs.i[b, 0]), int(pairs.j[b, 0])  # its first key pair: two sample indices

Q, K = capture.q.values[h].astype(float), capture.k.values[h].astype(float)  # [sample, dim] raw vectors
t = capture.position.values.astype(float)
tc = t - t.mean()
beta = (Q - Q.mean(0)).T @ tc / (tc @ tc)  # [dim] slopes of the query coordinates on position
u = beta / np.linalg.norm(beta) - np.eye(len(beta))[0]
H = np.eye(len(beta)) - 2 * np.outer(u, u) / (u @ u)  # Householder: H beta_hat = e_1 (eq. 4.10)
Qr, Kr = Q @ H, K @ H  # rotated coordinates (H is symmetric)
beta_pos = (Qr[:, 0] - Qr[:, 0].mean()) @ tc / (tc @ tc)  # coordinate 1: global linear fit in position
alpha_pos = Qr[:, 0].mean() - beta_pos * t.mean()
sigma2_pos = ((Qr[:, 0] - alpha_pos - beta_pos * t) ** 2).sum() / (len(t) - 2)
in_b = capture.bucket.values == b
mu_b, var_b = Qr[in_b].mean(0), Qr[in_b].var(0, ddof=1)  # the bucket's semantic mean and variances
tau = float(ps.tau.sel(query_bucket=b))  # the bucket's midpoint
delta = Kr[i] - Kr[j]
mu = delta[0] * (alpha_pos + beta_pos * tau) + delta[1:] @ mu_b[1:]  # eq. 4.11
v = delta[0] ** 2 * sigma2_pos + (delta[1:] ** 2 * var_b[1:]).sum()  # eq. 4.12 (diagonal)
z = mu / np.sqrt(v)
pp = 4 * norm.cdf(z) * norm.cdf(-z)  # eq. 4.14

lib = ps.isel(head=0).sel(query_bucket=b).isel(pair=0)
assert np.abs((H @ beta)[1:]).max() < 1e-12 * np.linalg.norm(beta), "coordinates 2..d carry no query drift"
hand = pd.DataFrame({"by hand": [delta[0], mu, v, z, pp],
                     "qkplast": [float(lib.delta1), float(lib.mu), float(lib.v_diag),
                                 float(lib.mu / np.sqrt(lib.v_diag)), float(lib.pp)]},
                    index=["delta_1", "mu", "v", "z", "PP"])
assert np.allclose(hand["by hand"], hand["qkplast"], rtol=1e-9, atol=0)
print(f"head {h} (layer {int(capture.layer[h])}, q_head {int(capture.q_head[h])}), query bucket {b} (tau = {tau:g}), "
      f"keys at positions {t[i]:.0f} and {t[j]:.0f} of document {str(capture.doc.values[i])!r}")
hand

# %% [markdown]
# ## The plasticity profile
#
# Bucket 0 has no earlier bucket, hence no key pairs, and no plasticity: the note above says so.

# %%
profile = pd.DataFrame({
    "tau": metrics.tau.values, "queries": metrics.n_queries.values, "pairs": metrics.n_pairs.values,
    "AP closed form": metrics.ap.mean("head").values, "AP Monte Carlo": metrics.ap_mc.mean("head").values,
    # a head's pair-draw standard error, averaged over heads (all heads share one pair draw, so these errors
    # are correlated across heads and do not shrink with their number)
    "MC s.e. per head": metrics.ap_mc_se.mean("head").values,
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

# %% [markdown]
# (sec-departures)=
# ## Where the estimator departs from the definitions
#
# **Edges of unequal size.** Which query buckets the first and last fifth average under this run's options
# (bucket 0 has no earlier keys, so it never counts):

# %%
edges = results.edge_buckets(metrics)
edges

# %% [markdown]
# **Pair weighting** (Definition 4.3 against the estimator of 4.4.5). The same pairs, averaged with
# Definition 4.3's weights $1/(j-1) - 1/(t-1)$ instead of uniformly:

# %%
with warnings.catch_warnings():
    warnings.simplefilter("ignore", PlasticityWarning)  # bucket 0 again: the note at the top says so
    prefix = plasticity(capture, replace(analysis, pair_weight="prefix"))
names = ["ap_overall", "ap_first20", "ap_last20", "ap_drop"]
weighting = pd.DataFrame({"uniform (estimator, 4.4.5)": [float(metrics[n].mean()) for n in names],
                          "prefix (Definition 4.3)": [float(prefix[n].mean()) for n in names]}, index=names)
weighting["difference"] = weighting.iloc[:, 1] - weighting.iloc[:, 0]
weighting.round(4)

# %% [markdown]
# **Pooled against within-document query statistics** (Definition 4.1 conditions on the prefix):

# %%
from qkplast.analysis.pooling import pooling_table

pooling, reading = pooling_table(capture, names, replace(analysis, semantic_stats="per_bucket"))
print(reading)
pooling.round(4)

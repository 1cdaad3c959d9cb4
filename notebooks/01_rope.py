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
# # Background: rotary position embeddings
#
# Attention compares a query $q_t$ with every earlier key $k_i$ through the score
# $s(q_t, k_i) = q_t^\top k_i / \sqrt{d}$ (thesis eq. 2.2). Without positional information this score
# would only see token identities. Rotary position embeddings (RoPE, {cite:p}`su2024roformer`) inject
# position by rotating each query and key in $d/2$ planes: pair $k$ of coordinates,
# $(x_{2k}, x_{2k+1})$, is turned by the angle $t\,\theta_k$ at position $t$, with
# $\theta_k = \theta_{\text{base}}^{-2k/d}$ (eq. 2.5).
#
# Because rotations compose, $R(t\theta)^\top R(i\theta) = R((i-t)\theta)$, so
#
# $$
# \mathrm{RoPE}(q, t)^\top \mathrm{RoPE}(k, i) = f(q, k, t - i)
# $$
#
# depends on the offset $t-i$ only (eq. 2.6). The vectors that attention receives still carry absolute
# position, entangled with content: that is what the analyses of the following chapters measure.
#
# This page checks both properties on the rotary embedding of the embedded model, SmolLM2-135M, using the
# model's own transformers code.

# %% tags=["parameters"]
model = "smollm2-135m"  # the embedded default; any Hugging Face id or local checkpoint works
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run` (unused here, kept for a uniform batch)
corpus = "pydoc-topics"  # capture corpus of the batch (unused here)
docs = 8  # document windows of the batch (unused here)
seq_len = 2048  # tokens per window of the default capture, drawn beside the model's maximum
bucket_size = 128  # position bucket width of the batch (unused here)
samples_per_bucket = 4  # sampled positions per bucket and document in the batch (unused here)
heads = 300  # query heads sampled by the batch (unused here)
seed = 0  # seed of the random draws of the relative-position check
device = "cpu"  # the rotary code runs on the CPU; it is tiny
dtype = "auto"  # capture precision of the batch (unused here)
rope_scaling = None  # RoPE override, e.g. "yarn:4:32768" for Qwen3 at 128K (section 5.4.2)
analysis = {}  # qkplast.AnalysisOptions overrides, e.g. {"covariance": "full"}; empty: the thesis defaults
n_draws = 256  # random (q, k, t, i, shift) draws for the relative-position check

# %%
import qkplast.plots as qp
from qkplast.rope import check_relative_property, frequency_table, model_rotary

rope = model_rotary(model)
print(f"{rope.model_type}: head_dim {rope.head_dim}, theta_base {rope.theta:g}, max positions {rope.max_positions}")

# %% [markdown]
# ## The relative-position property
#
# Draw random $q, k$, positions $t, i$ and a shift $s$; the score at $(t, i)$ must equal the score at
# $(t+s, i+s)$. The model computes its angles in float32, whose absolute error grows like
# $t \cdot 6\times10^{-8}$ rad, so equality holds to about $10^{-5}$ relative to $\lVert q\rVert\lVert k\rVert$.

# %%
check = check_relative_property(rope, n=n_draws, seed=seed)
assert check.passed, check
check

# %% [markdown]
# ## The frequency structure
#
# The wavelength $2\pi/\theta_k$ of pair $k$ ranges from about six tokens to far beyond the context:
# fast pairs encode fine, local position; the slowest pairs turn less than once over the whole window, so
# along them the rotation looks like a slow linear drift. That quasi-linear drift is what the drift axis
# of the planar rotation model picks up ({doc}`04_rotation`).

# %%
table = frequency_table(rope)
slow = table[table.turns_over_context < 1]
print(f"{len(slow)} of {len(table)} rotation pairs turn less than once over {rope.max_positions} tokens")
print(f"{int((table.wavelength_tokens > seq_len).sum())} pairs have a wavelength longer than the "
      f"{seq_len}-token capture window")
table.iloc[[0, 1, 2, 8, 16, 24, 30, 31]].round(4)

# %%
fig = qp.rope_frequencies(table, {"capture window": seq_len, "model maximum": rope.max_positions})

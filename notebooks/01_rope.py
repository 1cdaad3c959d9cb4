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
# This page checks both properties on the rotary embedding the run's capture used (by default the embedded
# SmolLM2-135M), built by the model's own transformers code from the same checkpoint revision and with the
# same RoPE scaling override (e.g. YaRN for Qwen3 at 128K, section 5.4.2).

# %% tags=["parameters"]
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run`: its manifest names the model, revision and RoPE
check_seed = 0  # seed of the random draws of the relative-position check
n_draws = 256  # random (q, k, t, i, shift) draws for the relative-position check

# %%
import qkplast.results.figures as qp
from qkplast.rundir import run_settings
from qkplast.theory.rope import check_relative_property, frequency_table, model_rotary

options = run_settings(run_dir, globals())[0]  # the run's capture settings (defaults for a new run); papermill -p overrides
seq_len = options.seq_len
rope = model_rotary(options.model, revision=options.revision, rope_scaling=options.rope_scaling)
print(f"{options.model} at revision {options.revision or 'as cached'}, RoPE override {options.rope_scaling or 'none'}")
print(f"{rope.model_type}: head_dim {rope.head_dim}, theta_base {rope.theta:g}, max positions {rope.max_positions}, "
      f"attention scaling {float(getattr(rope.module, 'attention_scaling', 1.0)):.4f}")

# %% [markdown]
# ## The relative-position property
#
# Draw random $q, k$, positions $t, i$ and a shift $s$; the score at $(t, i)$ must equal the score at
# $(t+s, i+s)$. The model computes its angles in float32, whose absolute error grows like
# $t \cdot 6\times10^{-8}$ rad, so equality holds to about that much relative to $\lVert q\rVert\lVert k\rVert$;
# the tolerance is twice the float32 angle error at the end of the capture window (at least $10^{-4}$).

# %%
window = min(seq_len or rope.max_positions, rope.max_positions)
check = check_relative_property(rope, n=n_draws, max_position=window, seed=check_seed, rtol=max(1e-4, 2 * 6e-8 * window))
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
table.iloc[[i for i in (0, 1, 2, 8, 16, 24, 30, 31) if i < len(table)]].round(4)  # rows shown (a tiny test model has fewer)

# %%
fig = qp.rope_frequencies(table, {"capture window": seq_len, "model maximum": rope.max_positions})

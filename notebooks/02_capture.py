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
# # Capture protocol
#
# Every analysis in this book reads one object: the query and key vectors that a head's attention kernel
# actually receives, at a sample of token positions (thesis section 4.1). For each sampled query head $h_q$
# the matching key head follows from grouped-query attention,
#
# $$
# h_k = \left\lfloor h_q \,/\, (n_q / n_{kv}) \right\rfloor \qquad \text{(eq. 4.1)},
# $$
#
# so a *head* below is a (query head, key head) pair. The vectors are taken after the projections, after
# any q/k normalisation (Qwen3) and after the rotary embedding, and before the key heads are repeated for
# the group: `qkplast.capture.driver` registers its own attention function with transformers, records the
# sampled rows and hands the call on to the real kernel (SDPA by default). Its tests check, for every
# supported family, that the recorded $q^\top k/\sqrt{d}$ equals the model's own eager attention logits.
#
# **Positions.** The context window is cut into buckets of $B$ tokens; every token is kept with
# probability $m/B$, so each bucket receives $m$ samples per document in expectation, independent of
# where documents concentrate their tokens. The thesis used $B = 8192$ over 128K tokens and $m = 1$ on
# 500 LongBench-Pro documents. The default run is the same setting in miniature, sized to finish in a few
# minutes on a CPU: SmolLM2-135M across its whole trained window, 4 single documents of at least 8192 tokens
# from the CPython documentation (`python-docs`, never concatenated), $B = 512$ (the same 16 buckets) and
# $m = 8$, so each bucket holds about 32 queries.

# %% tags=["parameters"]
run_dir = "../runs/smollm2-135m"  # run directory of `qkplast run`; its manifest holds the capture and analysis settings

# %%
import numpy as np
import pandas as pd

import qkplast
import qkplast.results.figures as qp
from qkplast.rundir import chapter_run

run = chapter_run(run_dir, globals())  # the run's settings from its manifest (defaults for a new run), -p overrides; prints what it holds
capture, metrics = run.capture, run.metrics
seq_len, bucket_size, samples_per_bucket = run.options.seq_len, run.options.bucket_size, run.options.samples_per_bucket
print(f"{capture.sizes['head']} heads x {capture.sizes['sample']} sampled positions x {capture.sizes['dim']} dims")
print(f"model {capture.attrs['model']} ({capture.attrs['model_family']}), {capture.attrs['dtype']}, "
      f"corpus {capture.attrs['corpus']}")

# %% [markdown]
# ## What a capture holds
#
# `q` and `k` have dims `(head, sample, dim)`; every sample carries its token `position`, its `bucket`,
# its document id `doc` and its `token`; every head carries `layer`, `q_head`, `kv_head` and `rope`.
# `qkplast.validate_capture` checks the whole contract, the GQA mapping of eq. 4.1 included.

# %%
qkplast.validate_capture(capture)
group = capture.attrs["n_q_heads"] // capture.attrs["n_kv_heads"]
assert (capture.kv_head == capture.q_head // group).all()
pd.DataFrame({"layer": capture.layer.values, "q_head": capture.q_head.values, "kv_head": capture.kv_head.values,
              "rope": capture.rope.values}).head(12)

# %% [markdown]
# **Families whose vectors carry something more.** Two families change what "the vector the kernel
# receives" means, and a capture of them stores it beside the vectors. GPT-NeoX (the Pythia series) turns
# only the first quarter of each head's dimensions (`rotary_pct = 0.25`); the coordinate `rotary` on `dim`
# marks them, and the analyses use the whole vector, as $q^\top k$ sums over every dimension
# (`AnalysisOptions(head_dims="rotary")` or `"non_rotary"` analyses one part). Ministral-3 multiplies its
# queries after the rotary embedding by a factor that depends on the position only,
# $s(t) = 1 + \beta \log\left(1 + \lfloor t / T_0 \rfloor\right)$, with $\beta$ = `llama_4_scaling_beta`
# and $T_0$ the original window of its YaRN extension: 1 inside that window, growing in steps beyond it. The
# captured queries include the factor, the coordinate `query_scale` records it per sample, and the defaults
# analyse the queries as captured (`AnalysisOptions(query_scale="as_captured")`): plasticity is a property of
# the scores the model computes, and the factor is part of them. `query_scale="divided_out"` divides it out
# to show the geometry of the rotary embedding alone; the two coincide for windows within $T_0$ and for every
# other family, whose captures carry no factor.

# %% [markdown]
# ## Coverage of the context window
#
# Uniform bucket sampling gives every bucket the same expected number of samples, whatever the document.

# %%
counts = np.bincount(capture.bucket.values, minlength=seq_len // bucket_size)
print("samples per bucket:", counts.tolist())
print(f"expected {samples_per_bucket * capture.attrs['n_docs']} per bucket; smallest {counts.min()}, largest {counts.max()}")
if counts.min() == 0:
    print("warning: some buckets have no samples; their statistics will be NaN (raise docs or samples_per_bucket)")
fig = qp.sampling_coverage(capture)

# %% [markdown]
# ## Reproducibility
#
# Head sampling uses `numpy.random.default_rng(seed)`; position sampling is seeded from the seed and the
# document id, so a document's positions do not depend on which other documents are captured. Every
# choice is recorded in the capture's attributes:

# %%
for key in ("head_sampling", "position_sampling", "capture_point", "short_docs_policy"):
    print(f"{key}: {capture.attrs[key]}\n")

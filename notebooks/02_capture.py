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
# the group: `qkplast.capture` registers its own attention function with transformers, records the
# sampled rows and hands the call on to the real kernel (SDPA by default). Its tests check, for every
# supported family, that the recorded $q^\top k/\sqrt{d}$ equals the model's own eager attention logits.
#
# **Positions.** The context window is cut into buckets of $B$ tokens; every token is kept with
# probability $m/B$, so each bucket receives $m$ samples per document in expectation, independent of
# where documents concentrate their tokens. The thesis used $B = 8192$ over 128K tokens and $m = 1$ on
# 500 LongBench-Pro documents. The default run here is smaller so that it finishes in about a minute on a
# CPU: 8 windows of 2048 tokens from the Python documentation, $B = 128$ (the same 16 buckets) and $m = 4$.

# %% tags=["parameters"]
model = "smollm2-135m"  # the embedded default; any Hugging Face id or local checkpoint works
run_dir = "../runs/smollm2-135m"  # where the capture and metrics live; created on first use
corpus = "pydoc-topics"  # prose that every Python install carries (the standard library docs)
docs = 8  # document windows: with 4 samples per bucket, 32 queries per bucket for the statistics
seq_len = 2048  # tokens per window: 16 buckets of 128 and a CPU forward of a few seconds
bucket_size = 128  # 16 buckets, the thesis's count (it used 131072 / 8192)
samples_per_bucket = 4  # more than the thesis's 1 because this corpus is small
heads = 300  # as in the thesis; SmolLM2 has 270 query heads, so all are taken
seed = 0  # seed of head and position sampling and of the key-pair draw
device = "cpu"  # "cuda" runs the capture in bf16 on a GPU
dtype = "auto"  # fp32 on CPU, bf16 on GPU
rope_scaling = None  # RoPE override, e.g. "yarn:4:32768" for Qwen3 at 128K (section 5.4.2)
analysis = {}  # qkplast.AnalysisOptions overrides, e.g. {"covariance": "full"}; empty: the thesis defaults

# %%
import numpy as np
import pandas as pd

import qkplast
import qkplast.plots as qp
from qkplast.batch import load_or_capture

capture = load_or_capture(run_dir, model=model, corpus=corpus, docs=docs, seq_len=seq_len, bucket_size=bucket_size,
                          samples_per_bucket=samples_per_bucket, heads=heads, seed=seed, device=device, dtype=dtype, rope_scaling=rope_scaling)
print(f"{capture.sizes['head']} heads x {capture.sizes['sample']} sampled positions x {capture.sizes['dim']} dims "
      f"from {capture.attrs['n_docs']} windows of {capture.attrs['seq_len']} tokens")
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

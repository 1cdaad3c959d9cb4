"""Capture correctness on tiny random models of every supported family, and sampling (the embedded SmolLM2:
tests/integration/capture/test_capture.py).

Reference for "what attention computes": the model's own eager attention
forward. With ``attn_implementation="eager"`` every attention module returns
its softmax probabilities ``P`` as the second output; a forward hook records
them. For a query row ``i`` and two visible keys ``j, j'``,
``log P[i, j] - log P[i, j'] = s[i, j] - s[i, j']`` where ``s`` are the
pre-softmax logits (the additive mask is zero on visible keys and the
normaliser cancels). Comparing these differences with the captured
``(q_i . k_j - q_i . k_j') * scaling`` therefore checks the captured vectors
against the logits the model itself used, with no reimplementation of its
attention, for every pair of sampled positions in the causal (and window)
range. ``scaling`` is checked to be ``head_dim ** -0.5``.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
import transformers as T
from hypothesis import given, settings
from hypothesis import strategies as st

from qkplast.capture.driver import (
    LayerInfo,
    ArchitectureSpec,
    UnsupportedModelError,
    capture,
    inspect_model,
    sample_heads,
    sample_positions,
    text_decoder,
)
from tests.eager_reference import attention_modules as _attention_modules, compare_with_eager
from qkplast.capture.corpus import Document, iter_windows
from qkplast.capture_format import validate_capture
from qkplast.options import CaptureOptions
from tests.helpers import tiny_model, tiny_tokenizer

SEQ_LEN = 64
BUCKET = 8


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _documents():
    from pydoc_data.topics import topics

    return [
        Document("doc α/1", topics["assert"] * 3),
        Document("short one", "The pass statement does nothing at all. " * 2),
        Document("doc-2", topics["for"]),
        Document("short+two", "An assignment binds a name to an object. " * 2),
        Document("3", topics["if"]),
    ]


def _check_against_eager(model, tokenizer, ds):
    """Captured q.k * scaling reproduces the eager logits (up to each row's constant) at all sampled pairs."""
    windows = iter_windows(_documents(), tokenizer, ds.attrs["seq_len"])
    assert compare_with_eager(model, ds, windows) > 50, "too few sampled pairs to make the comparison meaningful"


def _options(**kw) -> CaptureOptions:
    base = {"seq_len": SEQ_LEN, "bucket_size": BUCKET, "samples_per_bucket": 4, "heads": None, "docs": None,
            "short_docs": "concat"}
    return CaptureOptions(**{**base, **kw})


def _capture(model, tokenizer, **kw):
    ds = capture(model, tokenizer, _documents(), options=_options(**kw), progress=False)
    validate_capture(ds)
    return ds


@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral", "ministral3", "mistral3", "smollm3", "mllama"])
def test_captured_logits_equal_eager_attention(family, tokenizer):
    model = tiny_model(family)
    ds = _capture(model, tokenizer)
    text = model.config.get_text_config()
    assert ds.attrs["family_verified"] is True
    assert (ds.attrs["n_q_heads"], ds.attrs["n_kv_heads"]) == (text.num_attention_heads, text.num_key_value_heads)
    _check_against_eager(model, tokenizer, ds)


def test_eager_delegate_captures_the_same_vectors(tokenizer):
    model = tiny_model("qwen3")
    via_sdpa = _capture(model, tokenizer)
    via_eager = _capture(model, tokenizer, attn="eager")
    np.testing.assert_allclose(via_eager["q"].values, via_sdpa["q"].values, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(via_eager["k"].values, via_sdpa["k"].values, rtol=1e-5, atol=1e-6)
    assert "eager" in via_eager.attrs["attn_implementation"]


def test_capture_leaves_the_model_output_and_attention_setting_unchanged(tokenizer):
    model = tiny_model("llama")
    ids = torch.arange(40)[None] % 300
    with torch.inference_mode():
        before = model(ids).logits
    _capture(model, tokenizer)
    with torch.inference_mode():
        after = model(ids).logits
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(before, after)


def test_bfloat16_model_gives_float32_vectors(tokenizer):
    model = tiny_model("llama").to(torch.bfloat16)
    ds = _capture(model, tokenizer, heads=3)
    assert ds["q"].dtype == np.float32 and ds["k"].dtype == np.float32
    assert ds.attrs["dtype"] == "bfloat16"
    # bf16 vectors are exactly representable in float32: the low 16 bits of every value are zero.
    assert not (ds["q"].values.view(np.uint32) & 0xFFFF).any()


def test_sliding_window_layers_are_absent(tokenizer):
    model = tiny_model("ministral")
    ds = _capture(model, tokenizer)
    assert set(ds["layer"].values.tolist()) == {1}
    assert ds.attrs["eligible_layers"] == [1]
    assert ds.attrs["excluded_layers"] == {"0": "sliding_attention layer", "2": "sliding_attention layer"}
    assert ds.attrs["heads_eligible"] == 4
    _check_against_eager(model, tokenizer, ds)


def test_all_sliding_mistral_is_refused(tokenizer):
    with pytest.raises(UnsupportedModelError, match="sliding-window attention"):
        _capture(tiny_model("mistral-swa"), tokenizer)


def _raw_projections(model):
    """Forward hooks recording q_proj/k_proj outputs of full-length forwards, reshaped to [seq, head, dim]."""
    raw, handles = {}, []
    for layer, module in _attention_modules(model).items():
        for name in ("q_proj", "k_proj"):

            def hook(m, args, out, key=(layer, name[0]), d=module.head_dim):
                if out.shape[1] == SEQ_LEN:
                    raw.setdefault(key, []).append(out[0].reshape(SEQ_LEN, -1, d).clone())  # [seq, head, dim]

            handles.append(getattr(module, name).register_forward_hook(hook))
    return raw, handles


def test_nope_layers_equal_raw_projections(tokenizer):
    model = tiny_model("smollm3")
    raw, handles = _raw_projections(model)
    try:
        ds = _capture(model, tokenizer, docs=1)
    finally:
        for h in handles:
            h.remove()
    assert ds["rope"].values.tolist() == [layer % 2 == 0 for layer in ds["layer"].values]
    pos = ds["position"].values
    for h in range(ds.sizes["head"]):
        layer, qh, kvh = int(ds["layer"][h]), int(ds["q_head"][h]), int(ds["kv_head"][h])
        q_raw = raw[(layer, "q")][0][pos, qh].numpy()  # [sample, dim]
        k_raw = raw[(layer, "k")][0][pos, kvh].numpy()  # [sample, dim]
        if ds["rope"][h]:
            assert not np.allclose(ds["q"].values[h][pos > 0], q_raw[pos > 0], atol=1e-3)
        else:
            np.testing.assert_array_equal(ds["q"].values[h], q_raw)
            np.testing.assert_array_equal(ds["k"].values[h], k_raw)
    _check_against_eager(model, tokenizer, ds)


def test_qwen3_capture_includes_qk_norm_before_rope(tokenizer):
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    model = tiny_model("qwen3")
    modules = _attention_modules(model)
    for m in modules.values():  # non-trivial norm weights, so that forgetting the norm would show
        m.q_norm.weight.data.uniform_(0.5, 2.0)
        m.k_norm.weight.data.uniform_(0.5, 2.0)
    normed, raw, handles = {}, {}, []

    def keep(store, key, reshape=False):
        def hook(module, args, out):
            if out.shape[1] == SEQ_LEN and key not in store:  # first full-length forward only
                store[key] = (out[0].reshape(SEQ_LEN, -1, 8) if reshape else out[0]).clone()  # [seq, head, dim]

        return hook

    for layer, m in modules.items():
        for name in ("q", "k"):
            handles.append(getattr(m, f"{name}_norm").register_forward_hook(keep(normed, (layer, name))))
            handles.append(getattr(m, f"{name}_proj").register_forward_hook(keep(raw, (layer, name), reshape=True)))
    try:
        ds = _capture(model, tokenizer, docs=1)
    finally:
        for h in handles:
            h.remove()
    decoder = text_decoder(model)
    position_ids = torch.arange(SEQ_LEN)[None]
    cos, sin = decoder.rotary_emb(torch.zeros(1, SEQ_LEN, 32), position_ids)
    pos = ds["position"].values
    for h in range(ds.sizes["head"]):
        layer, qh, kvh = int(ds["layer"][h]), int(ds["q_head"][h]), int(ds["kv_head"][h])
        q_n, k_n = (
            normed[(layer, "q")].transpose(0, 1)[None],
            normed[(layer, "k")].transpose(0, 1)[None],
        )  # [1, head, seq, dim]
        q_rot, k_rot = apply_rotary_pos_emb(q_n, k_n, cos, sin)  # [1, head, seq, dim]
        np.testing.assert_allclose(ds["q"].values[h], q_rot[0, qh, pos].numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ds["k"].values[h], k_rot[0, kvh, pos].numpy(), rtol=1e-6, atol=1e-6)
        q_plain, _ = apply_rotary_pos_emb(raw[(layer, "q")].transpose(0, 1)[None], k_n, cos, sin)  # without q_norm
        assert not np.allclose(ds["q"].values[h], q_plain[0, qh, pos].numpy(), atol=1e-3)


def test_mllama_cross_attention_layers_neither_captured_nor_counted(tokenizer):
    model = tiny_model("mllama")
    layout = inspect_model(model)
    assert [info.layer for info in layout.layers] == [0, 2, 3]
    plan = sample_heads(layout, heads=None)
    assert 1 not in plan.layer and plan.n_eligible == 3 * 4
    ds = _capture(model, tokenizer, heads=5, seed=3)
    expected = sample_heads(layout, heads=5, seed=3)
    assert ds["layer"].values.tolist() == expected.layer.tolist()
    assert ds.attrs["heads_eligible"] == 12


def test_gqa_mapping_and_shared_keys(tokenizer):
    model = tiny_model("llama")
    ds = _capture(model, tokenizer)
    assert ds.sizes["head"] == 3 * 4
    np.testing.assert_array_equal(ds["kv_head"].values, ds["q_head"].values // 2)
    # Query heads of one group share their key head: identical captured keys.
    for layer in range(3):
        for kv in range(2):
            idx = np.flatnonzero((ds["layer"].values == layer) & (ds["kv_head"].values == kv))
            assert len(idx) == 2
            np.testing.assert_array_equal(ds["k"].values[idx[0]], ds["k"].values[idx[1]])
            assert not np.array_equal(ds["q"].values[idx[0]], ds["q"].values[idx[1]])


def _layout(n_layers=10, n_q=8, n_kv=2, excluded=()):
    layers = [LayerInfo(i, i % 4 != 3, i not in excluded, "sliding" if i in excluded else "") for i in range(n_layers)]
    return ArchitectureSpec(layers, n_q, n_kv, 16, "llama", True, {})


def test_head_sampling_follows_the_documented_draw():
    layout = _layout(excluded=(2, 5))
    plan = sample_heads(layout, heads=30, seed=0)
    pairs = [(layer, h) for layer in layout.eligible_layers for h in range(8)]
    chosen = np.sort(np.random.default_rng(0).choice(len(pairs), size=30, replace=False))
    assert list(zip(plan.layer.tolist(), plan.q_head.tolist(), strict=True)) == [pairs[i] for i in chosen]
    assert not set(plan.layer.tolist()) & {2, 5}
    np.testing.assert_array_equal(plan.kv_head, plan.q_head // 4)
    np.testing.assert_array_equal(plan.rope, plan.layer % 4 != 3)
    assert plan.n_eligible == 64
    keys = list(zip(plan.layer.tolist(), plan.q_head.tolist(), strict=True))
    assert keys == sorted(keys) and len(set(keys)) == 30
    assert sample_heads(layout, heads=30, seed=0).layer.tolist() == plan.layer.tolist()
    other = sample_heads(layout, heads=30, seed=1)
    assert list(zip(other.layer.tolist(), other.q_head.tolist(), strict=True)) != keys


def test_head_sampling_takes_all_when_fewer_and_is_uniform():
    layout = _layout(n_layers=3, n_q=4, n_kv=4)
    assert len(sample_heads(layout, heads=300)) == 12
    assert len(sample_heads(layout, heads=None)) == 12
    counts = np.zeros((3, 4))
    for seed in range(3000):
        plan = sample_heads(layout, heads=3, seed=seed)
        np.add.at(counts, (plan.layer, plan.q_head), 1)
    # Each pair is drawn with probability 3/12; 3000 draws give 750 +- 24 (one sd).
    assert np.abs(counts - 750).max() < 5 * 24
    with pytest.raises(ValueError, match="heads must be positive"):
        sample_heads(layout, heads=0)


def test_position_sampling_is_seeded_per_document():
    a = sample_positions(4096, 256, doc_id="a", seed=0)
    assert np.array_equal(a, sample_positions(4096, 256, doc_id="a", seed=0))
    assert not np.array_equal(a, sample_positions(4096, 256, doc_id="b", seed=0))
    assert not np.array_equal(a, sample_positions(4096, 256, doc_id="a", seed=1))
    words = np.frombuffer(hashlib.sha256(b"a").digest(), dtype=np.uint32)
    rng = np.random.default_rng(np.random.SeedSequence([0, *words.tolist()]))
    np.testing.assert_array_equal(a, np.flatnonzero(rng.random(4096) < 1 / 256))


def test_position_sampling_keeps_one_per_bucket_in_expectation():
    counts = np.zeros(16)
    for i in range(2000):
        pos = sample_positions(4096, 256, doc_id=f"doc {i}", seed=0)
        np.add.at(counts, pos // 256, 1)
    # Binomial(256, 1/256) per bucket per document: mean 1, sd ~1; over 2000 documents sd ~45.
    assert np.abs(counts - 2000).max() < 5 * 45
    many = np.mean([len(sample_positions(4096, 256, doc_id=str(i), samples_per_bucket=4)) for i in range(300)])
    assert many == pytest.approx(64, rel=0.05)


@settings(max_examples=60, deadline=None)
@given(
    seq_len=st.integers(1, 600),
    bucket_size=st.integers(1, 80),
    per_bucket=st.floats(0.01, 1.0),
    minimum=st.integers(0, 5),
    doc=st.text(max_size=12),
)
def test_position_sampling_properties(seq_len, bucket_size, per_bucket, minimum, doc):
    bucket_size = min(bucket_size, seq_len)
    pos = sample_positions(seq_len, bucket_size, doc_id=doc, samples_per_bucket=per_bucket, min_per_bucket=minimum)
    assert pos.dtype == np.int64 and np.all(np.diff(pos) > 0)
    assert pos.size == 0 or (pos.min() >= 0 and pos.max() < seq_len)
    sizes = np.bincount(np.arange(seq_len) // bucket_size)
    counts = np.bincount(pos // bucket_size, minlength=len(sizes))
    assert np.all(counts >= np.minimum(minimum, sizes))


def test_positions_do_not_depend_on_document_order(tokenizer):
    model = tiny_model("llama")
    forward = _capture(model, tokenizer, heads=2, samples_per_bucket=1)
    docs = _documents()[::-1]
    backward = capture(model, tokenizer, docs, options=_options(samples_per_bucket=1, heads=2), progress=False)
    for doc in ("doc α/1", "doc-2", "3"):  # reversing the corpus changes which short documents are joined
        f, b = forward["doc"].values == doc, backward["doc"].values == doc
        np.testing.assert_array_equal(forward["position"].values[f], backward["position"].values[b])
        np.testing.assert_array_equal(forward["q"].values[:, f], backward["q"].values[:, b])


def test_unverified_family_needs_opt_in(tokenizer):
    model = tiny_model("qwen2")
    with pytest.raises(UnsupportedModelError, match="supported: Llama 3.x"):
        _capture(model, tokenizer)
    ds = _capture(model, tokenizer, allow_unverified=True)
    assert ds.attrs["family_verified"] is False
    _check_against_eager(model, tokenizer, ds)


def test_model_without_attention_interface_is_refused():
    config = T.MambaConfig(hidden_size=16, state_size=4, num_hidden_layers=2, vocab_size=64)
    model = T.MambaForCausalLM(config).eval()
    with pytest.raises(UnsupportedModelError, match="no layer of MambaForCausalLM called"):
        inspect_model(model, allow_unverified=True)


def test_capture_attrs_make_the_run_reproducible(tokenizer):
    ds = _capture(tiny_model("qwen3"), tokenizer, heads=5, seed=7)
    attrs = ds.attrs
    for key in ("model", "seq_len", "bucket_size", "seed", "dtype", "corpus", "n_q_heads", "n_kv_heads"):
        assert key in attrs
    assert attrs["seed"] == 7 and attrs["heads"] == 5 and attrs["samples_per_bucket"] == 4
    assert attrs["n_docs"] == 4 and attrs["dtype"] == "float32" and attrs["device"] == "cpu"
    assert attrs["transformers"] == T.__version__ and attrs["torch"] == torch.__version__
    assert attrs["attn_implementation"].startswith("qkplast_capture")
    assert attrs["window_parts"] == {"short one+short+two": ["short one", "short+two"]}
    from dataclasses import fields

    # Every option under its own name, resolved to what ran; the counts actually captured under other names.
    assert all(f.name in attrs for f in fields(CaptureOptions))
    recorded = CaptureOptions(**{f.name: attrs[f.name] for f in fields(CaptureOptions)})
    assert (recorded.seq_len, recorded.bucket_size, recorded.docs, recorded.corpus) == (64, 8, None, "in-memory documents")
    assert attrs["n_heads"] == 5 and "commit" in attrs and "heads_requested" not in attrs
    json.dumps(attrs)  # the io layer stores attrs as JSON

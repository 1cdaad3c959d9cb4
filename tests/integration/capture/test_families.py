"""The capture families of the public checkpoint series, each against the model's own eager attention.

As for the thesis's families (``tests/test_capture.py``), the reference is the
model's own eager attention (``tests/eager_reference.py``): the captured
``(q_i . k_j - q_i . k_j') * scaling`` must reproduce the differences of the eager
log-probabilities at every pair of sampled positions. No attention is
reimplemented for the reference.

Beyond the logits, each family's peculiarity is checked against the model's
own intermediate tensors (forward hooks) and its own rotary function:

* GPT-NeoX (Pythia): only the first ``rotary_pct = 0.25`` of each head's
  dimensions rotate; the capture records which (``rotary`` on ``dim``), the
  other dimensions are the raw projection bit for bit;
* OLMo-2: query/key RMS norm over the whole projection before RoPE;
* Lucie-7B: a Llama (verified family) with RoPE base 20M after its extension;
* Ministral-3: the position-dependent query factor (``query_scale`` on
  ``sample``) is what the kernel's queries carry, equal to the documented
  formula, absent from the keys.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers as T


from tests.eager_reference import attention_modules as _attention_modules, compare_with_eager  # noqa: E402
from tests.hub_fixtures import tiny_model as hub_tiny_model, tiny_tokenizer  # noqa: E402
from qkplast.capture.corpus import Document, iter_windows  # noqa: E402
from qkplast.capture.driver import capture, text_decoder  # noqa: E402
from qkplast.capture_format import validate_capture  # noqa: E402
from qkplast.options import CaptureOptions  # noqa: E402

pytestmark = pytest.mark.integration

SEQ_LEN, BUCKET = 64, 8


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _documents():
    from pydoc_data.topics import topics

    return [Document("assert", topics["assert"] * 3), Document("for", topics["for"]), Document("if", topics["if"])]


def _capture(model, tokenizer, **kw):
    options = CaptureOptions(**{"seq_len": SEQ_LEN, "bucket_size": BUCKET, "samples_per_bucket": 4, "heads": None,
                                "docs": None, "short_docs": "skip", **kw})
    return validate_capture(capture(model, tokenizer, _documents(), options=options, progress=False))


def _check_against_eager(model, tokenizer, ds) -> int:
    """Captured q.k * scaling reproduces the eager logits at every sampled pair (``tests/eager_reference.py``)."""
    checked = compare_with_eager(model, ds, iter_windows(_documents(), tokenizer, SEQ_LEN))
    assert checked > 100, "too few sampled pairs to make the comparison meaningful"
    return checked


def _first_forward_outputs(modules: dict, submodule: str):
    """Forward hooks keeping each layer's ``submodule`` output of the first full-window forward ([seq, features])."""
    store, handles = {}, []
    for layer, m in modules.items():
        def hook(module, args, out, layer=layer):
            if out.shape[1] == SEQ_LEN and layer not in store:
                store[layer] = out[0].detach().clone()  # [seq, features]

        handles.append(getattr(m, submodule).register_forward_hook(hook))
    return store, handles


# --------------------------------------------------------------------------- GPT-NeoX (Pythia)


def test_gpt_neox_capture_equals_eager_attention_and_records_the_rotary_quarter(tokenizer):
    model = hub_tiny_model("gpt_neox")
    ds = _capture(model, tokenizer)
    assert ds.attrs["model_family"] == "gpt_neox" and ds.attrs["family_verified"] is True
    assert (ds.attrs["n_q_heads"], ds.attrs["n_kv_heads"], ds.attrs["head_dim"]) == (4, 4, 16)  # no GQA
    assert ds["kv_head"].values.tolist() == ds["q_head"].values.tolist()
    assert ds["rotary"].values.tolist() == [True] * 4 + [False] * 12  # rotary_pct 0.25 of 16 dims
    assert ds.attrs["rotary_dims"] == 4 and "query_scale" not in ds.coords
    _check_against_eager(model, tokenizer, ds)


def test_gpt_neox_non_rotary_dims_are_the_raw_projection(tokenizer):
    model = hub_tiny_model("gpt_neox")
    modules = _attention_modules(model)
    raw, handles = _first_forward_outputs(modules, "query_key_value")
    try:
        ds = _capture(model, tokenizer, docs=1)
    finally:
        for h in handles:
            h.remove()
    pos = ds["position"].values
    rotary = ds["rotary"].values
    for h in range(ds.sizes["head"]):
        layer, qh = int(ds["layer"][h]), int(ds["q_head"][h])
        qkv = raw[layer].reshape(SEQ_LEN, 4, 3 * 16)  # [seq, head, 3 * head_dim], GPT-NeoX's fused layout
        q_raw, k_raw = qkv[pos, qh, :16].numpy(), qkv[pos, qh, 16:32].numpy()  # [sample, dim]
        np.testing.assert_array_equal(ds["q"].values[h][:, ~rotary], q_raw[:, ~rotary])
        np.testing.assert_array_equal(ds["k"].values[h][:, ~rotary], k_raw[:, ~rotary])
        late = pos > 0
        assert not np.allclose(ds["q"].values[h][late][:, rotary], q_raw[late][:, rotary], atol=1e-4)


# --------------------------------------------------------------------------- OLMo-2


def test_olmo2_capture_is_post_norm_post_rope_and_equals_eager_attention(tokenizer):
    from transformers.models.olmo2.modeling_olmo2 import apply_rotary_pos_emb

    model = hub_tiny_model("olmo2")
    modules = _attention_modules(model)
    for m in modules.values():  # non-trivial norm weights, so that forgetting the norm would show
        m.q_norm.weight.data.uniform_(0.5, 2.0)
        m.k_norm.weight.data.uniform_(0.5, 2.0)
    normed_q, hq = _first_forward_outputs(modules, "q_norm")
    normed_k, hk = _first_forward_outputs(modules, "k_norm")
    raw_q, hr = _first_forward_outputs(modules, "q_proj")
    try:
        ds = _capture(model, tokenizer, docs=1)
    finally:
        for h in hq + hk + hr:
            h.remove()
    assert ds.attrs["model_family"] == "olmo2" and ds.attrs["family_verified"] is True
    assert ds["rotary"].values.all()
    cos, sin = text_decoder(model).rotary_emb(torch.zeros(1, SEQ_LEN, 64), torch.arange(SEQ_LEN)[None])
    pos = ds["position"].values
    for h in range(ds.sizes["head"]):
        layer, qh, kvh = int(ds["layer"][h]), int(ds["q_head"][h]), int(ds["kv_head"][h])
        q_n = normed_q[layer].reshape(SEQ_LEN, 4, 16).transpose(0, 1)[None]  # [1, head, seq, dim]
        k_n = normed_k[layer].reshape(SEQ_LEN, 1, 16).transpose(0, 1)[None]  # [1, kv head, seq, dim]
        q_rot, k_rot = apply_rotary_pos_emb(q_n, k_n, cos, sin)
        np.testing.assert_allclose(ds["q"].values[h], q_rot[0, qh, pos].numpy(), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ds["k"].values[h], k_rot[0, kvh, pos].numpy(), rtol=1e-6, atol=1e-6)
        q_plain = raw_q[layer].reshape(SEQ_LEN, 4, 16).transpose(0, 1)[None]  # the projection without its norm
        q_plain_rot, _ = apply_rotary_pos_emb(q_plain, k_n, cos, sin)
        assert not np.allclose(ds["q"].values[h], q_plain_rot[0, qh, pos].numpy(), atol=1e-3)
    _check_against_eager(model, tokenizer, ds)


# --------------------------------------------------------------------------- Lucie-7B (Llama)


def test_lucie_is_a_llama_with_its_extended_rope_base(tokenizer):
    model = hub_tiny_model("lucie")
    ds = _capture(model, tokenizer)
    assert ds.attrs["model_family"] == "llama" and ds.attrs["family_verified"] is True
    assert ds.attrs["rope_parameters"]["rope_theta"] == 2e7 and ds.attrs["max_position_embeddings"] == 32000
    assert (ds.attrs["n_q_heads"], ds.attrs["n_kv_heads"]) == (4, 1)
    _check_against_eager(model, tokenizer, ds)


# --------------------------------------------------------------------------- Ministral-3's query scale


def _ministral3(original: int = 16, beta: float = 0.5):
    """A tiny Ministral-3 whose original window is 16 positions, so its query factor steps inside 64 tokens."""
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": original, "rope_theta": 10000.0,
            "llama_4_scaling_beta": beta}
    config = T.Ministral3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, head_dim=8, vocab_size=300, max_position_embeddings=64,
                                rope_parameters=rope)
    torch.manual_seed(0)
    return T.Ministral3ForCausalLM(config).eval()


def test_ministral3_query_scale_is_recorded_per_position_and_is_what_the_queries_carry(tokenizer):
    from transformers.models.ministral3.modeling_ministral3 import apply_rotary_pos_emb

    model = _ministral3()
    modules = _attention_modules(model)
    raw_q, hq = _first_forward_outputs(modules, "q_proj")
    raw_k, hk = _first_forward_outputs(modules, "k_proj")
    try:
        ds = _capture(model, tokenizer, docs=1)
    finally:
        for h in hq + hk:
            h.remove()
    pos = ds["position"].values
    # the documented formula, by hand: 1 + beta log(1 + floor(t / original)), beta 0.5, original 16
    by_hand = np.array([1 + 0.5 * math.log(1 + p // 16) for p in pos])
    np.testing.assert_allclose(ds["query_scale"].values, by_hand, rtol=1e-7)
    assert ds["query_scale"].values.max() > 1.5 and ds["query_scale"].values[pos < 16].tolist() == [1.0] * (pos < 16).sum()
    assert ds.attrs["query_scale_rule"] and ds["rotary"].values.all()
    cos, sin = text_decoder(model).rotary_emb(torch.zeros(1, SEQ_LEN, 8), torch.arange(SEQ_LEN)[None])
    for h in range(ds.sizes["head"]):
        layer, qh, kvh = int(ds["layer"][h]), int(ds["q_head"][h]), int(ds["kv_head"][h])
        q = raw_q[layer].reshape(SEQ_LEN, 4, 8).transpose(0, 1)[None]  # [1, head, seq, dim]
        k = raw_k[layer].reshape(SEQ_LEN, 2, 8).transpose(0, 1)[None]  # [1, kv head, seq, dim]
        q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
        np.testing.assert_allclose(ds["q"].values[h], q_rot[0, qh, pos].numpy() * by_hand[:, None], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(ds["k"].values[h], k_rot[0, kvh, pos].numpy(), rtol=1e-6, atol=1e-6)  # no factor
    _check_against_eager(model, tokenizer, ds)


def test_ministral3_query_scale_in_bfloat16_is_the_factor_the_model_applies(tokenizer):
    model = _ministral3().to(torch.bfloat16)
    ds = _capture(model, tokenizer, docs=1)
    pos = ds["position"].values
    exact = np.array([1 + 0.5 * math.log(1 + p // 16) for p in pos])
    rounded = torch.as_tensor(exact).to(torch.bfloat16).double().numpy()  # the model casts the factor to its dtype
    np.testing.assert_array_equal(ds["query_scale"].values, rounded)

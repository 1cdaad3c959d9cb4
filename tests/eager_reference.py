"""The reference every capture test compares with: the model's own eager attention, never a reimplementation.

With ``attn_implementation="eager"`` every attention module returns its softmax
probabilities ``P`` as the second output; a forward hook records them. For a
query row ``i`` and two visible keys ``j, j'``,
``log P[i, j] - log P[i, j'] = s[i, j] - s[i, j']`` where ``s`` are the
pre-softmax logits (the additive mask is zero on visible keys and the
normaliser cancels). Comparing these differences with the captured
``(q_i . k_j - q_i . k_j') * scaling`` checks the captured vectors against the
logits the model itself used, for every pair of sampled positions in the causal
range. ``scaling`` is checked to be ``head_dim ** -0.5``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkplast.capture.hooks import text_decoder


def attention_modules(model) -> dict:
    """Attention modules of the text decoder by layer (GPT-NeoX's have no ``q_proj``: matched by class name)."""
    decoder = text_decoder(model)
    return {m.layer_idx: m for m in decoder.modules()
            if type(m).__name__.endswith("Attention") and getattr(m, "layer_idx", None) is not None}


def eager_probabilities(model, input_ids) -> dict:
    """Softmax probabilities of every attention layer under the model's own eager attention (layer -> [n_q, seq, seq])."""
    decoder = text_decoder(model)
    previous = decoder.config._attn_implementation
    decoder.set_attn_implementation("eager")
    probs, handles = {}, []
    for layer, module in attention_modules(model).items():
        handles.append(module.register_forward_hook(lambda m, a, out, layer=layer: probs.__setitem__(layer, out[1][0])))
    try:
        with torch.inference_mode():
            decoder(input_ids=torch.as_tensor(input_ids)[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
        decoder.set_attn_implementation(previous)
    return probs


def compare_with_eager(model, ds, windows) -> int:
    """Assert that captured ``q . k * scaling`` reproduces the eager logits (up to each row's constant) at every pair
    of sampled positions of every window (objects with ``doc_id`` and ``input_ids``); return the pairs compared."""
    modules = attention_modules(model)
    checked = 0
    for window in windows:
        sel = np.flatnonzero(ds["doc"].values == window.doc_id)
        pos = ds["position"].values[sel]
        if len(pos) < 2:
            continue
        probs = eager_probabilities(model, window.input_ids)
        for h in range(ds.sizes["head"]):
            layer, qh = int(ds["layer"][h]), int(ds["q_head"][h])
            scaling = modules[layer].scaling
            assert scaling == pytest.approx(ds.attrs["head_dim"] ** -0.5)
            q = ds["q"].values[h][sel].astype(np.float64)  # [sample, dim]
            k = ds["k"].values[h][sel].astype(np.float64)  # [sample, dim]
            logits = q @ k.T * scaling  # [sample, sample]
            with np.errstate(divide="ignore"):  # masked keys have probability 0; only visible ones are compared
                logp = np.log(probs[layer][qh].numpy().astype(np.float64))[np.ix_(pos, pos)]  # [sample, sample]
            visible = pos[None, :] <= pos[:, None]  # causal; captured layers have no window
            diag = np.arange(len(pos))
            np.testing.assert_allclose((logits - logits[diag, diag][:, None])[visible],
                                       (logp - logp[diag, diag][:, None])[visible], rtol=1e-5, atol=2e-5)
            checked += int(visible.sum()) - len(pos)
    return checked

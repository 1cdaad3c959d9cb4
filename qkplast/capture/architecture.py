"""The attention layout of a model: which layers reach the capture entry point, with which heads.

Before capturing, a short probe forward records which modules call the
entry point, with which shapes and which ``sliding_window``; a model none of
whose layers calls it, or one whose layers do not all reach it, is refused
(:func:`inspect_model`). Eligible layers are full-attention self-attention
layers: sliding-window (or other non-full) layers are excluded, and
cross-attention layers are never called on text input, so they are neither
captured nor counted (thesis 4.1.3).

:func:`architecture_from_config` predicts the same layout from the config alone,
for the planner, which must not load weights.

Two properties of a family change what the captured vectors mean, and the
layout records both, so the capture can store them beside the vectors:

* ``rotary_dims``: how many leading dimensions of each head the rotary
  embedding turns (GPT-NeoX/Pythia: ``partial_rotary_factor`` 0.25 of the
  head, the module's ``rotary_ndims``; every other family: all of them);
* ``query_scale``: Ministral-3's position-dependent query factor
  (Llama-4 style, ``1 + beta log(1 + floor(t / original))``), computed by
  the modeling file's own function and rounded to the model's dtype as the
  model applies it; None for families without one.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from qkplast.capture.hooks import CAPTURE_ATTN, UnsupportedModelError, attention_switched, recording_into, register_capture_attention, text_decoder

__all__ = ["SUPPORTED_FAMILIES", "LayerInfo", "ArchitectureSpec", "inspect_model", "kv_heads", "architecture_from_config",
           "query_scale_function", "rotary_dims"]

SUPPORTED_FAMILIES = (
    "Llama 3.x, SmolLM2 and Lucie (llama), Qwen3 (qwen3), Mistral (mistral), Ministral (ministral), "
    "Ministral-3 (ministral3, mistral3), SmolLM3 (smollm3), Llama 3.2 Vision (mllama), "
    "GPT-NeoX/Pythia (gpt_neox), OLMo-2 (olmo2)"
)
# Model types whose capture is verified against the model's own eager attention (tests/integration/capture/test_capture.py,
# tests/integration/capture/test_families.py).
_VERIFIED_MODEL_TYPES = frozenset(
    {"llama", "qwen3", "mistral", "ministral", "ministral3", "mistral3", "smollm3", "mllama", "gpt_neox", "olmo2"}
)
_VERIFIED_TEXT_TYPES = frozenset(
    {"llama", "qwen3", "mistral", "ministral", "ministral3", "smollm3", "mllama_text_model", "gpt_neox", "olmo2"}
)
_PROBE_TOKENS = 8
@dataclass(frozen=True)
class LayerInfo:
    """What the probe forward saw of one self-attention layer.

    Attributes
    ----------
    layer : int
        ``module.layer_idx``.
    rope : bool
        Whether the layer applies a rotary embedding (False for SmolLM3 NoPE layers).
    eligible : bool
        Full attention over the whole causal prefix, hence captured (thesis 4.1.3).
    reason : str
        Why the layer is excluded (empty if eligible).
    """

    layer: int
    rope: bool
    eligible: bool
    reason: str = ""


@dataclass
class ArchitectureSpec:
    """The attention layout of a model as observed through the capture entry point.

    Attributes
    ----------
    layers : list of LayerInfo
        Every self-attention layer that called the entry point, by layer index.
    n_q_heads, n_kv_heads, head_dim : int
    family : str
        ``model_type`` of the model and of its text config, e.g. ``"mllama/mllama_text_model"``.
    verified : bool
        Whether the family is one whose capture the test-suite verifies.
    modules : dict
        ``id(attention module) -> layer index``, to recognise calls during capture.
    calls_per_forward : int
        Entry-point calls in one text forward (for progress bars).
    rotary_dims : int or None
        Leading dimensions of each head that the rotary embedding turns in the
        RoPE layers (None: all ``head_dim``); GPT-NeoX turns a quarter.
    query_scale : callable or None
        ``positions [sample] -> factor [sample]`` (float64) that multiplies the
        queries before the kernel (Ministral-3), None when there is none.
    """

    layers: list[LayerInfo]
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    family: str
    verified: bool
    modules: dict = field(repr=False)
    calls_per_forward: int = 0
    rotary_dims: int | None = None
    query_scale: object = field(default=None, repr=False)

    @property
    def rotary_mask(self):
        """``[dim]`` booleans: the dimensions the rotary embedding turns in RoPE layers."""
        import numpy as np

        turned = self.head_dim if self.rotary_dims is None else self.rotary_dims
        return np.arange(self.head_dim) < turned

    @property
    def eligible_layers(self) -> list[int]:
        """Indices of the layers that are captured."""
        return [info.layer for info in self.layers if info.eligible]

    def excluded(self) -> dict[str, str]:
        """``{layer index (str): reason}`` for the layers left out."""
        return {str(info.layer): info.reason for info in self.layers if not info.eligible}


class _Probe:
    """Records who calls the entry point during the probe forward, without copying anything."""

    def __init__(self):
        self.calls: list[tuple] = []

    def observe(self, module, query, key, kwargs):
        self.calls.append((module, tuple(query.shape), tuple(key.shape), kwargs.get("sliding_window")))


def _uses_rope(module, text_config, layer: int) -> bool:
    # SmolLM3 (and Llama 4) keep the per-layer decision on the module and in
    # config.no_rope_layers, where 1 means "this layer applies RoPE".
    if hasattr(module, "use_rope"):
        return bool(module.use_rope)
    no_rope_layers = getattr(text_config, "no_rope_layers", None)
    if no_rope_layers is not None:
        return bool(no_rope_layers[layer])
    return bool(getattr(text_config, "rope_parameters", None))


def _exclusion(module, text_config, layer: int, kw_window) -> str:
    layer_types = getattr(text_config, "layer_types", None)
    layer_type = layer_types[layer] if layer_types else None
    if layer_type not in (None, "full_attention"):
        return f"{layer_type} layer"
    window = kw_window if kw_window is not None else getattr(module, "sliding_window", None)
    if window is not None:
        return f"sliding-window attention (window {window})"
    return ""


def kv_heads(text_config) -> int:
    """Key-value heads of a text config; configs without GQA (GPT-NeoX) have as many as query heads."""
    return int(getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads)


def rotary_dims(text_config, head_dim: int, module=None) -> int:
    """Leading dimensions per head that the rotary embedding turns: the module's ``rotary_ndims`` (GPT-NeoX) if it
    has one, else ``head_dim x partial_rotary_factor`` of the config's RoPE parameters (1 when absent)."""
    if module is not None and getattr(module, "rotary_ndims", None) is not None:
        return int(module.rotary_ndims)
    factor = (getattr(text_config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    return int(head_dim * float(factor))


def query_scale_function(model, module):
    """The query factor ``positions -> factor`` that ``module`` applies after RoPE, or None.

    Ministral-3 (and Mistral-4) multiply the rotated queries by
    ``get_llama_4_attn_scale(position_ids, beta, original_max_position_embeddings)``
    from their modeling file, with ``beta = rope_parameters["llama_4_scaling_beta"]``,
    cast to the query's dtype. The same function of the same module is called
    here, and its value rounded to the model's dtype, so the recorded factor is
    the one the kernel's queries carry.
    """
    import numpy as np
    import torch

    fn = getattr(sys.modules.get(type(module).__module__), "get_llama_4_attn_scale", None)
    rope = getattr(model.config.get_text_config(), "rope_parameters", None) or {}
    beta = rope.get("llama_4_scaling_beta")
    if fn is None or beta is None:
        return None
    original, dtype = rope.get("original_max_position_embeddings"), model.dtype

    def factor(positions) -> np.ndarray:
        ids = torch.as_tensor(np.asarray(positions, dtype=np.int64))[None]  # [batch, sample]
        return fn(ids, beta, original).to(dtype).double().flatten().numpy()  # [sample]

    return factor


def _family(model) -> tuple[str, bool]:
    top = model.config.model_type
    text = model.config.get_text_config().model_type
    family = top if top == text else f"{top}/{text}"
    return family, top in _VERIFIED_MODEL_TYPES and text in _VERIFIED_TEXT_TYPES


def inspect_model(model, *, attn: str = "sdpa", allow_unverified: bool = False) -> ArchitectureSpec:
    """Run a short probe forward through the capture entry point and describe the attention layout.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    attn : {"sdpa", "eager"}
        Delegate kernel, see :func:`register_capture_attention`.
    allow_unverified : bool
        Accept a model family outside :data:`SUPPORTED_FAMILIES` as long as the
        probe shows every decoder layer calling the entry point.

    Raises
    ------
    UnsupportedModelError
        Unverified family (unless allowed), no layer calling the entry point,
        layers that bypass it, key heads already repeated, or no eligible layer.
    """
    import torch

    family, verified = _family(model)
    if not verified and not allow_unverified:
        raise UnsupportedModelError(
            f"model family {family!r} ({type(model).__name__}) is not one whose capture qkplast verifies; "
            f"supported: {SUPPORTED_FAMILIES}. Pass allow_unverified=True (CLI: --allow-unverified) to capture "
            "it anyway if its attention goes through the transformers attention interface"
        )
    decoder = text_decoder(model)
    text_config = model.config.get_text_config()
    probe = _Probe()
    vocab = int(text_config.vocab_size)
    ids = (torch.arange(_PROBE_TOKENS) % vocab).unsqueeze(0).to(decoder.device)  # [batch, seq]
    with attention_switched(decoder, register_capture_attention(attn)), recording_into(probe), torch.inference_mode():
        decoder(input_ids=ids, use_cache=False)
    if not probe.calls:
        raise UnsupportedModelError(
            f"no layer of {type(model).__name__} called the '{CAPTURE_ATTN}' attention function, so its attention "
            "does not go through the transformers attention interface and cannot be captured; "
            f"supported: {SUPPORTED_FAMILIES}"
        )
    n_q, n_kv = int(text_config.num_attention_heads), kv_heads(text_config)
    layers, modules, head_dims, turned, scales = [], {}, set(), set(), []
    for module, q_shape, k_shape, window in probe.calls:
        layer = getattr(module, "layer_idx", None)
        if layer is None:
            raise UnsupportedModelError(f"{type(module).__name__} has no layer_idx; supported: {SUPPORTED_FAMILIES}")
        if q_shape[2] != k_shape[2]:
            continue  # cross-attention: keys come from another sequence
        if layer in modules.values() or id(module) in modules:
            raise UnsupportedModelError(f"layer {layer} called the attention function twice in one forward")
        if q_shape[1] != n_q or k_shape[1] != n_kv:
            raise UnsupportedModelError(
                f"layer {layer} passed {q_shape[1]} query and {k_shape[1]} key heads to the attention function, "
                f"but the config has {n_q} and {n_kv}: the capture needs keys before GQA repetition"
            )
        modules[id(module)] = layer
        head_dims.add(q_shape[3])
        reason = _exclusion(module, text_config, layer, window)
        rope = _uses_rope(module, text_config, layer)
        layers.append(LayerInfo(layer, rope, not reason, reason))
        if rope:
            turned.add(rotary_dims(text_config, q_shape[3], module))
        scales.append(query_scale_function(model, module))
    declared_cross = set(getattr(text_config, "cross_attention_layers", None) or ())
    missing = sorted(set(range(int(text_config.num_hidden_layers))) - set(modules.values()) - declared_cross)
    if missing:
        raise UnsupportedModelError(
            f"layers {missing} of {type(model).__name__} never called the attention function (not standard "
            f"self-attention), so the model cannot be captured faithfully; supported: {SUPPORTED_FAMILIES}"
        )
    if len(head_dims) != 1:
        raise UnsupportedModelError(f"layers use different head dimensions {sorted(head_dims)}")
    if len(turned) > 1:
        raise UnsupportedModelError(f"RoPE layers turn different numbers of dimensions {sorted(turned)}")
    layers.sort(key=lambda info: info.layer)
    if not any(info.eligible for info in layers):
        reasons = sorted({info.reason for info in layers})
        raise UnsupportedModelError(
            f"no layer of {type(model).__name__} is a full-attention layer ({'; '.join(reasons)}); "
            "only full-attention layers are captured (thesis 4.1.3)"
        )
    head_dim = head_dims.pop()
    return ArchitectureSpec(layers, n_q, n_kv, head_dim, family, verified, modules, len(probe.calls),
                       rotary_dims=turned.pop() if turned else head_dim, query_scale=scales[0])


def architecture_from_config(config) -> ArchitectureSpec:
    """The layout :func:`inspect_model` would observe, predicted from the config alone (no weights, no forward).

    Layers listed in ``cross_attention_layers`` are left out, ``layer_types``
    other than ``full_attention`` and a config-wide ``sliding_window`` exclude
    a layer, ``no_rope_layers`` marks NoPE layers. The probe stays the
    authority at capture time; this is what the planner can know beforehand.
    """
    text = config.get_text_config()
    top, kind = config.model_type, text.model_type
    family = top if top == kind else f"{top}/{kind}"
    verified = top in _VERIFIED_MODEL_TYPES and kind in _VERIFIED_TEXT_TYPES
    cross = set(getattr(text, "cross_attention_layers", None) or ())
    window = getattr(text, "sliding_window", None) if getattr(text, "use_sliding_window", True) else None
    layers = []
    for layer in range(int(text.num_hidden_layers)):
        if layer in cross:
            continue
        reason = _exclusion(None, text, layer, None)
        if not reason and window is not None and getattr(text, "layer_types", None) is None:
            reason = f"sliding-window attention (window {window})"
        layers.append(LayerInfo(layer, _uses_rope(None, text, layer), not reason, reason))
    n_q = int(text.num_attention_heads)
    head_dim = int(getattr(text, "head_dim", None) or int(text.hidden_size) // n_q)
    return ArchitectureSpec(layers, n_q, kv_heads(text), head_dim, family, verified, {}, len(layers),
                       rotary_dims=rotary_dims(text, head_dim))

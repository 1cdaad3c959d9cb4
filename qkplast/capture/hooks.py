"""The attention hook: one function registered with transformers' attention interface.

Transformers routes every attention call of the supported families through
``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]``, called as
``fn(module, query, key, value, attention_mask, **kwargs)`` with post-RoPE
``query`` ``[batch, n_q_heads, seq, head_dim]`` and ``key``
``[batch, n_kv_heads, seq, head_dim]``. qkplast registers its own function
under ``qkplast_capture`` (``qkplast_capture_eager`` for the eager delegate).
While a model's text decoder is switched to it, the function

1. applies the active *transforms* in order (:func:`attention_transform`;
   interventions are transforms), each
   ``fn(module, query, key, value, attention_mask, kwargs) -> (query, key, value, attention_mask)``;
2. lets the active *recorder* (the capture) observe the transformed tensors,
   so a capture inside an intervention sees what the kernel sees;
3. hands everything to the real kernel (sdpa, or the modeling file's eager).

Transforms and the recorder live in context variables, so contexts nest and
compose, and nothing about the model object changes but its attention
implementation name, restored on exit. No modeling file is copied or patched.
"""

from __future__ import annotations

import contextvars
import sys
from contextlib import contextmanager

from qkplast.capture_format import CaptureError

CAPTURE_ATTN = "qkplast_capture"
DELEGATES = ("sdpa", "eager")

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("qkplast_capture_recorder", default=None)
_TRANSFORMS: contextvars.ContextVar = contextvars.ContextVar("qkplast_attention_transforms", default=())


class UnsupportedModelError(CaptureError):
    """The model's attention cannot be captured (or its capture is not verified)."""


def capture_attn_name(delegate: str) -> str:
    """The attention-implementation name under which the capture hook delegating to ``delegate`` is registered."""
    return CAPTURE_ATTN if delegate == "sdpa" else f"{CAPTURE_ATTN}_{delegate}"


_EAGER_CACHE: dict[type, object] = {}


def _eager_for(module):
    """The eager attention function of the module's own modeling file (what ``attn_implementation='eager'`` runs)."""
    cls = type(module)
    if cls not in _EAGER_CACHE:
        fn = getattr(sys.modules.get(cls.__module__), "eager_attention_forward", None)
        if fn is None:
            raise UnsupportedModelError(
                f"{cls.__name__} has no eager_attention_forward to delegate to; use attn='sdpa'"
            )
        _EAGER_CACHE[cls] = fn
    return _EAGER_CACHE[cls]


def _make_hook(delegate: str):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def qkplast_capture_attention(module, query, key, value, attention_mask, **kwargs):
        for transform in _TRANSFORMS.get():
            query, key, value, attention_mask = transform(module, query, key, value, attention_mask, kwargs)
        recorder = _ACTIVE.get()
        if recorder is not None:
            recorder.observe(module, query, key, kwargs)
        kernel = _eager_for(module) if delegate == "eager" else ALL_ATTENTION_FUNCTIONS[delegate]
        return kernel(module, query, key, value, attention_mask, **kwargs)

    return qkplast_capture_attention


def register_capture_attention(delegate: str = "sdpa") -> str:
    """Register the capture hook with transformers and return its implementation name.

    Parameters
    ----------
    delegate : {"sdpa", "eager"}
        The kernel that computes attention after the hook has copied its rows.
        Flash attention cannot be delegated to under transformers 5.x: its
        integration chooses the kernel from the implementation *name*, which
        here is the hook's. On CUDA, sdpa itself dispatches to flash kernels.

    Returns
    -------
    str
        ``"qkplast_capture"`` for sdpa, ``"qkplast_capture_eager"`` for eager.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if delegate not in DELEGATES:
        raise CaptureError(
            f"attention implementation {delegate!r} cannot be wrapped by the capture hook; choose one of {DELEGATES} "
            "(on CUDA, sdpa dispatches to flash attention kernels itself)"
        )
    name = capture_attn_name(delegate)
    AttentionInterface.register(name, _make_hook(delegate))
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[delegate])
    return name


@contextmanager
def recording_into(recorder):
    token = _ACTIVE.set(recorder)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


@contextmanager
def attention_switched(decoder, name: str):
    previous = decoder.config._attn_implementation
    decoder.set_attn_implementation(name)
    try:
        yield
    finally:
        decoder.set_attn_implementation(previous)


def text_decoder(model):
    """The text decoder stack (e.g. ``LlamaModel``, Mllama's ``MllamaTextModel``) that capture runs."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model




@contextmanager
def attention_transform(model, transform, *, delegate: str = "sdpa"):
    """Apply ``transform`` to every attention call of ``model`` while open.

    ``transform(module, query, key, value, attention_mask, kwargs)`` returns
    ``(query, key, value, attention_mask)``; tensors are post-RoPE, before GQA
    repetition (``query`` ``[batch, n_q, seq, dim]``, ``key``/``value``
    ``[batch, n_kv, seq, dim]``). With sdpa a ``None`` mask means causal; a
    transform that returns a mask must include causality itself.

    The model's text decoder is switched to the qkplast attention function
    (delegating to ``delegate``) for the duration; transforms stack in the order
    the contexts were entered, and a capture opened inside sees their result.
    A transform should return its inputs unchanged for modules it does not target.
    """
    token = _TRANSFORMS.set(_TRANSFORMS.get() + (transform,))
    decoder = text_decoder(model)
    try:
        with attention_switched(decoder, register_capture_attention(delegate)):
            yield
    finally:
        _TRANSFORMS.reset(token)

"""Capture the post-RoPE queries and keys that attention actually receives (thesis sections 4.1, 5.4).

How the vectors are obtained
----------------------------
Transformers routes every attention call of the supported families through one
entry point: the attention module computes ``query``/``key`` (projection, then
q/k RMS-norm for Qwen3, then the rotary embedding unless the layer has none),
looks up ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation]`` and calls it
as ``fn(module, query, key, value, attention_mask, **kwargs)`` with ``query``
shaped ``[batch, n_q_heads, seq, head_dim]`` and ``key`` shaped
``[batch, n_kv_heads, seq, head_dim]`` -- grouped-query repetition happens
inside the kernel. qkplast registers its own function under the name
``qkplast_capture`` (``qkplast_capture_eager`` for the eager delegate) with
``AttentionInterface.register`` and switches the text decoder to it with
``set_attn_implementation``. The function copies the sampled rows of the
sampled heads (``index_select`` on the sequence, then on the head axis, then a
float32 copy on the CPU) and hands the unchanged arguments to the real kernel
(sdpa by default, or the modeling file's own eager function). No modeling file
is copied or patched, so the capture point moves with transformers: it is by
construction what the kernel receives. The attention masks are built by the
delegate's own mask function, registered under the same name.

Before capturing, a short probe forward records which modules call the entry
point, with which shapes and which ``sliding_window``; a model none of whose
layers calls it, or one whose layers do not all reach it, is refused.

Sampling
--------
* Heads (section 4.1.3): ``heads`` query heads uniformly at random over all
  (eligible layer, query head) pairs with ``numpy.random.default_rng(seed)``,
  all of them if fewer; key head ``q_head // (n_q / n_kv)`` (eq. 4.1). Eligible
  layers are full-attention self-attention layers: sliding-window (or other
  non-full) layers are excluded, and cross-attention layers are never called
  on text input, so they are neither captured nor counted.
* Positions (section 4.1.2): each token of ``[0, seq_len)`` is kept with
  probability ``samples_per_bucket / bucket_size``, independently, from a
  generator seeded by ``(seed, SHA-256 of the document id)``, so a document's
  positions do not depend on corpus order or on other documents; optionally at
  least ``min_per_bucket`` positions per bucket. Q and K use the same positions.

Streaming and resume
--------------------
With an output path ``OUT``, every finished document is written atomically to
``OUT.parts/doc-NNNNNN.nc`` next to ``manifest.json`` (the run's arguments and
library versions). A run started again with the same arguments reuses the parts
and continues; different arguments are refused unless ``overwrite``. ``OUT`` is
written atomically at the end (:func:`qkplast.io.save_capture`), then the parts
are removed; an existing ``OUT`` is never replaced without ``overwrite``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xarray as xr

from .corpus import Corpus, Document, WindowStats, describe_policy, iter_windows
from .hooks import (
    CAPTURE_ATTN,
    DELEGATES,
    UnsupportedModelError,
    _attention_switched,
    _recording,
    capture_attn_name,
    register_capture_attention,
    text_decoder,
)
from .io import CaptureError, open_dataset, save_capture, save_dataset

__all__ = [
    "CAPTURE_ATTN",
    "DELEGATES",
    "SUPPORTED_FAMILIES",
    "UnsupportedModelError",
    "LayerInfo",
    "ModelLayout",
    "HeadPlan",
    "capture_attn_name",
    "register_capture_attention",
    "text_decoder",
    "inspect_model",
    "sample_heads",
    "sample_positions",
    "Capturer",
    "capture",
    "run_capture",
]

SUPPORTED_FAMILIES = (
    "Llama 3.x and SmolLM2 (llama), Qwen3 (qwen3), Mistral (mistral), Ministral (ministral), "
    "Ministral-3 (ministral3, mistral3), SmolLM3 (smollm3), Llama 3.2 Vision (mllama)"
)
# Model types whose capture is verified by tests/test_capture.py against the model's own eager attention.
_VERIFIED_MODEL_TYPES = frozenset(
    {"llama", "qwen3", "mistral", "ministral", "ministral3", "mistral3", "smollm3", "mllama"}
)
_VERIFIED_TEXT_TYPES = frozenset(
    {"llama", "qwen3", "mistral", "ministral", "ministral3", "smollm3", "mllama_text_model"}
)
_PROBE_TOKENS = 8
_MANIFEST = "manifest.json"
_PART = "doc-{:06d}.nc"

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
class ModelLayout:
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
    """

    layers: list[LayerInfo]
    n_q_heads: int
    n_kv_heads: int
    head_dim: int
    family: str
    verified: bool
    modules: dict = field(repr=False)
    calls_per_forward: int = 0

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


def _family(model) -> tuple[str, bool]:
    top = model.config.model_type
    text = model.config.get_text_config().model_type
    family = top if top == text else f"{top}/{text}"
    return family, top in _VERIFIED_MODEL_TYPES and text in _VERIFIED_TEXT_TYPES


def inspect_model(model, *, attn: str = "sdpa", allow_unverified: bool = False) -> ModelLayout:
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
    with _attention_switched(decoder, register_capture_attention(attn)), _recording(probe), torch.inference_mode():
        decoder(input_ids=ids, use_cache=False)
    if not probe.calls:
        raise UnsupportedModelError(
            f"no layer of {type(model).__name__} called the '{CAPTURE_ATTN}' attention function, so its attention "
            "does not go through the transformers attention interface and cannot be captured; "
            f"supported: {SUPPORTED_FAMILIES}"
        )
    n_q, n_kv = int(text_config.num_attention_heads), int(text_config.num_key_value_heads)
    layers, modules, head_dims = [], {}, set()
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
        layers.append(LayerInfo(layer, _uses_rope(module, text_config, layer), not reason, reason))
    declared_cross = set(getattr(text_config, "cross_attention_layers", None) or ())
    missing = sorted(set(range(int(text_config.num_hidden_layers))) - set(modules.values()) - declared_cross)
    if missing:
        raise UnsupportedModelError(
            f"layers {missing} of {type(model).__name__} never called the attention function (not standard "
            f"self-attention), so the model cannot be captured faithfully; supported: {SUPPORTED_FAMILIES}"
        )
    if len(head_dims) != 1:
        raise UnsupportedModelError(f"layers use different head dimensions {sorted(head_dims)}")
    layers.sort(key=lambda info: info.layer)
    if not any(info.eligible for info in layers):
        reasons = sorted({info.reason for info in layers})
        raise UnsupportedModelError(
            f"no layer of {type(model).__name__} is a full-attention layer ({'; '.join(reasons)}); "
            "only full-attention layers are captured (thesis 4.1.3)"
        )
    return ModelLayout(layers, n_q, n_kv, head_dims.pop(), family, verified, modules, len(probe.calls))


@dataclass(frozen=True)
class HeadPlan:
    """The sampled query heads, sorted by (layer, q_head), and their key heads (eq. 4.1)."""

    layer: np.ndarray
    q_head: np.ndarray
    kv_head: np.ndarray
    rope: np.ndarray
    n_eligible: int
    requested: int | None
    seed: int

    def __len__(self) -> int:
        return len(self.layer)


def sample_heads(layout: ModelLayout, heads: int | None = 300, seed: int = 0) -> HeadPlan:
    """Sample ``heads`` query heads uniformly over (eligible layer, q_head) pairs (thesis 4.1.3).

    ``numpy.random.default_rng(seed).choice`` draws without replacement from the
    pairs listed in (layer, q_head) order; with ``heads=None`` or ``heads`` at
    least the number of eligible heads, all are taken.
    """
    if heads is not None and heads <= 0:
        raise CaptureError(f"heads must be positive, got {heads}")
    rope_of = {info.layer: info.rope for info in layout.layers}
    pairs = np.array([(layer, h) for layer in layout.eligible_layers for h in range(layout.n_q_heads)], dtype=np.int64)
    if heads is not None and heads < len(pairs):
        chosen = np.sort(np.random.default_rng(seed).choice(len(pairs), size=heads, replace=False))
        pairs = pairs[chosen]
    group = layout.n_q_heads // layout.n_kv_heads
    return HeadPlan(
        layer=pairs[:, 0],
        q_head=pairs[:, 1],
        kv_head=pairs[:, 1] // group,
        rope=np.array([rope_of[int(layer)] for layer in pairs[:, 0]], dtype=bool),
        n_eligible=len(layout.eligible_layers) * layout.n_q_heads,
        requested=heads,
        seed=seed,
    )


def _doc_seed(seed: int, doc_id: str) -> np.random.SeedSequence:
    words = np.frombuffer(hashlib.sha256(doc_id.encode("utf-8")).digest(), dtype=np.uint32)
    return np.random.SeedSequence([seed, *words.tolist()])


def sample_positions(
    seq_len: int,
    bucket_size: int,
    *,
    doc_id: str,
    seed: int = 0,
    samples_per_bucket: float = 1,
    min_per_bucket: int = 0,
) -> np.ndarray:
    """Sample token positions of one document (thesis 4.1.2).

    Each position in ``[0, seq_len)`` is kept independently with probability
    ``samples_per_bucket / bucket_size``, so a bucket holds ``samples_per_bucket``
    samples in expectation. Buckets with fewer than ``min_per_bucket`` kept
    positions are topped up with positions drawn uniformly without replacement
    from the rest of the bucket. The generator is seeded by ``seed`` and the
    SHA-256 of ``doc_id``, so the result does not depend on document order.

    Returns
    -------
    numpy.ndarray
        Sorted ``int64`` positions.
    """
    if not 0 < samples_per_bucket <= bucket_size:
        raise CaptureError(f"samples_per_bucket must lie in (0, bucket_size={bucket_size}], got {samples_per_bucket}")
    if min_per_bucket < 0:
        raise CaptureError(f"min_per_bucket must be non-negative, got {min_per_bucket}")
    rng = np.random.default_rng(_doc_seed(seed, doc_id))
    keep = rng.random(seq_len) < samples_per_bucket / bucket_size  # [seq_len]
    if min_per_bucket:
        for start in range(0, seq_len, bucket_size):
            bucket = keep[start : start + bucket_size]  # a view: topping up writes into keep
            short = min(min_per_bucket, bucket.size) - int(bucket.sum())
            if short > 0:
                bucket[rng.choice(np.flatnonzero(~bucket), size=short, replace=False)] = True
    return np.flatnonzero(keep).astype(np.int64)


class _DocumentRecorder:
    """Copies the sampled rows of the planned heads when the entry point is called during one forward."""

    def __init__(self, layout: ModelLayout, plan: HeadPlan, positions, device, on_call=None):
        import torch

        self.positions = torch.as_tensor(positions, dtype=torch.long, device=device)  # [sample]
        self.on_call = on_call
        self.layers: dict[int, tuple] = {}
        for layer in np.unique(plan.layer):
            sel = plan.layer == layer
            q_idx = torch.as_tensor(plan.q_head[sel], device=device)  # [head in layer]
            kv_idx = torch.as_tensor(plan.kv_head[sel], device=device)  # [head in layer]
            self.layers[int(layer)] = (q_idx, kv_idx)
        self.by_module = {mid: layer for mid, layer in layout.modules.items() if layer in self.layers}
        self.q: dict[int, object] = {}
        self.k: dict[int, object] = {}

    def observe(self, module, query, key, kwargs):
        import torch

        if self.on_call is not None:
            self.on_call()
        layer = self.by_module.get(id(module))
        if layer is None:
            return
        q_idx, kv_idx = self.layers[layer]
        # Rows first, then heads: never copies more than the sampled rows of the whole sequence.
        q = query[0].index_select(1, self.positions).index_select(0, q_idx)  # [head, sample, dim]
        k = key[0].index_select(1, self.positions).index_select(0, kv_idx)  # [head, sample, dim]
        self.q[layer] = q.to(dtype=torch.float32).cpu()
        self.k[layer] = k.to(dtype=torch.float32).cpu()

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        import torch

        missing = sorted(set(self.layers) - set(self.q))
        if missing:
            raise CaptureError(f"layers {missing} did not reach the capture entry point during the forward pass")
        order = sorted(self.layers)
        q = torch.cat([self.q[layer] for layer in order]).numpy()  # [head, sample, dim]
        k = torch.cat([self.k[layer] for layer in order]).numpy()  # [head, sample, dim]
        return q, k


class Capturer:
    """Capture context for one model: switches the text decoder to the capture entry point while open.

    On construction the model is probed (:func:`inspect_model`) and the heads are
    sampled (:func:`sample_heads`). Inside ``with capturer:``, :meth:`capture_window`
    runs one forward pass and returns the sampled rows.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    heads : int or None
        Number of query heads to sample; None for all.
    seed : int
    attn : {"sdpa", "eager"}
    allow_unverified : bool
    """

    def __init__(self, model, *, heads: int | None = 300, seed: int = 0, attn: str = "sdpa", allow_unverified=False):
        self.model = model
        self.decoder = text_decoder(model)
        self.attn = attn
        self.attn_name = register_capture_attention(attn)
        self.layout = inspect_model(model, attn=attn, allow_unverified=allow_unverified)
        self.plan = sample_heads(self.layout, heads, seed)
        self._switch = None

    def __enter__(self):
        self._switch = _attention_switched(self.decoder, self.attn_name)
        self._switch.__enter__()
        return self

    def __exit__(self, *exc):
        switch, self._switch = self._switch, None
        return switch.__exit__(*exc)

    def capture_window(self, input_ids: np.ndarray, positions: np.ndarray, *, on_call=None):
        """Run one forward pass over ``input_ids`` and return the sampled Q and K rows.

        Parameters
        ----------
        input_ids : numpy.ndarray
            Token ids, shape ``[seq]``.
        positions : numpy.ndarray
            Sorted positions to keep, shape ``[sample]``.
        on_call : callable, optional
            Called at every entry-point call (progress reporting).

        Returns
        -------
        q, k : numpy.ndarray
            ``float32``, shape ``[head, sample, head_dim]``, heads in plan order.
        """
        import torch

        if self._switch is None:
            raise CaptureError("Capturer.capture_window must run inside 'with capturer:'")
        recorder = _DocumentRecorder(self.layout, self.plan, positions, self.decoder.device, on_call)
        ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long, device=self.decoder.device)[None]  # [batch, seq]
        with _recording(recorder), torch.inference_mode():
            self.decoder(input_ids=ids, use_cache=False)
        return recorder.result()


def _versions() -> dict:
    import torch
    import transformers

    from . import __version__

    # str(): torch.__version__ is a str subclass that netCDF attribute writers reject.
    return {"qkplast": str(__version__), "transformers": str(transformers.__version__), "torch": str(torch.__version__)}


def _document_dataset(q, k, positions, window, bucket_size: int, plan: HeadPlan) -> xr.Dataset:
    return xr.Dataset(
        {"q": (("head", "sample", "dim"), q), "k": (("head", "sample", "dim"), k)},
        coords={
            "position": ("sample", positions.astype(np.int64)),
            "doc": ("sample", np.array([window.doc_id] * len(positions), dtype=str)),
            "bucket": ("sample", (positions // bucket_size).astype(np.int64)),
            "token": ("sample", window.input_ids[positions].astype(np.int64)),
            "layer": ("head", plan.layer),
            "q_head": ("head", plan.q_head),
            "kv_head": ("head", plan.kv_head),
            "rope": ("head", plan.rope),
        },
        attrs={"doc": window.doc_id, "parts": list(window.parts)},
    )


def _check_output(out: Path, overwrite: bool) -> None:
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (CLI: --overwrite) to replace it")
    if out.is_dir():
        raise IsADirectoryError(f"output {out} is a directory")
    if not out.parent.is_dir():
        raise FileNotFoundError(f"output directory {out.parent} does not exist")
    # Creating a file is the only reliable test: permission bits do not stop root, nor reveal read-only mounts.
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".probe", dir=out.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise PermissionError(f"output directory {out.parent} is not writable ({exc.strerror})") from exc


def _write_json_atomic(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _prepare_parts(parts: Path, manifest: dict, overwrite: bool) -> None:
    """Create or reuse the parts directory; refuse parts written with other arguments."""
    if parts.exists():
        try:
            previous = json.loads((parts / _MANIFEST).read_text())
        except (OSError, json.JSONDecodeError):
            previous = None
        if previous != manifest:
            if not overwrite:
                changed = (
                    sorted(k for k in manifest.keys() | previous.keys() if manifest.get(k) != previous.get(k))
                    if isinstance(previous, dict)
                    else ["<unreadable manifest>"]
                )
                raise CaptureError(
                    f"{parts} holds a partial capture made with different arguments (differing: {changed}); "
                    "rerun with the same arguments to resume, or pass overwrite=True (CLI: --overwrite) to discard it"
                )
            shutil.rmtree(parts)
    parts.mkdir(exist_ok=True)
    for stale in parts.glob("*.tmp"):
        stale.unlink()  # left by a run killed while writing
    _write_json_atomic(parts / _MANIFEST, manifest)


def capture(
    model,
    tokenizer,
    corpus: Corpus | Iterable[Document],
    out: str | os.PathLike | None = None,
    *,
    seq_len: int,
    bucket_size: int | None = None,
    samples_per_bucket: float = 1,
    min_per_bucket: int = 0,
    heads: int | None = 300,
    seed: int = 0,
    docs: int | None = None,
    attn: str = "sdpa",
    short_docs: str = "concat",
    overwrite: bool = False,
    allow_unverified: bool = False,
    progress: bool = True,
    model_info: dict | None = None,
) -> xr.Dataset:
    """Capture post-RoPE Q/K at sampled positions of sampled heads over a corpus.

    Parameters
    ----------
    model, tokenizer
        A loaded transformers model (eval mode) and its tokenizer.
    corpus : Corpus or iterable of Document
        Documents in a fixed order (see :mod:`qkplast.corpus`).
    out : path, optional
        Capture file to write; parts stream to ``OUT.parts/`` and a rerun with
        the same arguments resumes. Without ``out`` nothing is written.
    seq_len : int
        Tokens per document window; at most the model's maximum positions.
    bucket_size : int, optional
        Position bucket width; defaults to ``seq_len // 16`` (16 buckets, as in
        the thesis's 128K/8192 setting).
    samples_per_bucket : float
        Expected samples per bucket per document (keep probability
        ``samples_per_bucket / bucket_size``).
    min_per_bucket : int
        Guaranteed samples per bucket per document (0: none, as in the thesis).
    heads : int or None
        Query heads to sample (None: all).
    seed : int
    docs : int, optional
        Number of document windows to capture (None: all the corpus gives).
    attn : {"sdpa", "eager"}
        Kernel the capture hook delegates to.
    short_docs : {"concat", "skip"}
        Policy for documents shorter than ``seq_len``, see :func:`qkplast.corpus.iter_windows`.
    overwrite : bool
        Replace an existing ``out`` and discard parts made with other arguments.
    allow_unverified : bool
        Capture model families outside :data:`SUPPORTED_FAMILIES`.
    progress : bool
        Show tqdm bars (overall and per document).
    model_info : dict, optional
        Provenance of the model (from :func:`qkplast.models.load_model`).

    Returns
    -------
    xarray.Dataset
        The capture (see :mod:`qkplast.io`).

    Raises
    ------
    CaptureError
        Nothing captured, bad arguments, or parts from a different run.
    UnsupportedModelError
        The model cannot be captured.
    FileExistsError, FileNotFoundError, PermissionError
        Output problems, detected before any model work.
    """
    from tqdm.auto import tqdm

    from .models import check_seq_len

    bucket_size = max(1, seq_len // 16) if bucket_size is None else bucket_size
    if seq_len <= 0 or bucket_size <= 0:
        raise CaptureError(f"seq_len ({seq_len}) and bucket_size ({bucket_size}) must be positive")
    if bucket_size > seq_len:
        raise CaptureError(f"bucket_size {bucket_size} exceeds seq_len {seq_len}")
    if docs is not None and docs <= 0:
        raise CaptureError(f"docs must be positive, got {docs}")
    if not 0 < samples_per_bucket <= bucket_size:
        raise CaptureError(f"samples_per_bucket must lie in (0, bucket_size={bucket_size}], got {samples_per_bucket}")
    if min_per_bucket < 0:
        raise CaptureError(f"min_per_bucket must be non-negative, got {min_per_bucket}")
    out = None if out is None else Path(out)
    if out is not None:
        _check_output(out, overwrite)
    check_seq_len(model.config, seq_len, rope_scaling=(model_info or {}).get("rope_scaling"))

    capturer = Capturer(model, heads=heads, seed=seed, attn=attn, allow_unverified=allow_unverified)
    layout, plan = capturer.layout, capturer.plan
    text_config = model.config.get_text_config()
    if isinstance(corpus, Corpus):
        corpus_spec, corpus_details = corpus.spec, corpus.details
    else:
        corpus_spec, corpus_details = "in-memory documents", {"kind": "in-memory"}
    info = dict(model_info or {})
    info.setdefault("model", getattr(model.config, "_name_or_path", "") or type(model).__name__)
    info.setdefault("dtype", str(model.dtype).removeprefix("torch."))
    info.setdefault("device", str(capturer.decoder.device))
    manifest = {
        "model": info,
        "corpus": corpus_spec,
        "corpus_details": corpus_details,
        "seq_len": seq_len,
        "bucket_size": bucket_size,
        "samples_per_bucket": samples_per_bucket,
        "min_per_bucket": min_per_bucket,
        "heads": heads,
        "seed": seed,
        "docs": docs,
        "attn": attn,
        "short_docs": short_docs,
        "allow_unverified": allow_unverified,
        "versions": _versions(),
    }
    parts = None if out is None else out.with_name(out.name + ".parts")
    if parts is not None:
        _prepare_parts(parts, manifest, overwrite)

    stats = WindowStats()
    windows = iter_windows(corpus, tokenizer, seq_len, short_docs=short_docs, stats=stats)
    pieces, composite = [], {}
    overall = tqdm(total=docs, unit="doc", desc="capture", disable=not progress)
    with capturer, overall:
        for index, window in enumerate(itertools.islice(windows, docs)):
            if len(window.parts) > 1:
                composite[window.doc_id] = list(window.parts)
            part = None if parts is None else parts / _PART.format(index)
            if part is not None and part.exists():
                piece = open_dataset(part)
                if piece.attrs.get("doc") != window.doc_id:
                    raise CaptureError(
                        f"{part} holds document {piece.attrs.get('doc')!r} but the corpus now gives {window.doc_id!r} "
                        "at that index: the corpus changed since the interrupted run; pass --overwrite to start over"
                    )
            else:
                positions = sample_positions(
                    seq_len,
                    bucket_size,
                    doc_id=window.doc_id,
                    seed=seed,
                    samples_per_bucket=samples_per_bucket,
                    min_per_bucket=min_per_bucket,
                )
                if positions.size:
                    label = window.doc_id if len(window.doc_id) <= 40 else window.doc_id[:37] + "..."
                    with tqdm(
                        total=layout.calls_per_forward,
                        unit="layer",
                        desc=f"{label} ({seq_len} tokens)",
                        leave=False,
                        disable=not progress,
                    ) as bar:
                        q, k = capturer.capture_window(window.input_ids, positions, on_call=lambda: bar.update(1))
                else:
                    # No position drawn: the forward pass would record nothing, so it is skipped.
                    q = k = np.zeros((len(plan), 0, layout.head_dim), dtype=np.float32)
                piece = _document_dataset(q, k, positions, window, bucket_size, plan)
                if part is not None:
                    save_dataset(piece, part)
            pieces.append(piece)
            overall.update(1)

    n_docs = len(pieces)
    if n_docs == 0:
        if parts is not None:
            shutil.rmtree(parts)
        raise CaptureError(
            f"corpus {corpus_spec!r} gave no window of {seq_len} tokens ({stats.documents_read} documents read, "
            f"{stats.empty_documents_skipped} empty, {stats.short_documents_skipped} short ones skipped, "
            f"{stats.short_documents_left_over} short ones left over); nothing was captured"
        )
    nonempty = [piece for piece in pieces if piece.sizes["sample"]]
    if not nonempty:
        raise CaptureError(
            f"no position was sampled in {n_docs} documents (keep probability {samples_per_bucket}/{bucket_size}); "
            "capture more documents, raise samples_per_bucket or set min_per_bucket"
        )
    ds = xr.concat(nonempty, dim="sample", data_vars="all", coords="different", compat="equals", join="exact")
    ds.attrs = _capture_attrs(
        info, layout, plan, text_config, manifest, stats, composite, n_docs, corpus_spec, corpus_details, capturer
    )
    if out is not None:
        save_capture(ds, out, overwrite=overwrite)
        shutil.rmtree(parts)
    return ds


def _capture_attrs(info, layout, plan, text_config, manifest, stats, composite, n_docs, spec, details, capturer):
    seq_len, bucket_size = manifest["seq_len"], manifest["bucket_size"]
    return {
        "model": info["model"],
        "model_info": info,
        "model_family": layout.family,
        "family_verified": layout.verified,
        "seq_len": seq_len,
        "bucket_size": bucket_size,
        "n_buckets": -(-seq_len // bucket_size),
        "samples_per_bucket": manifest["samples_per_bucket"],
        "min_per_bucket": manifest["min_per_bucket"],
        "seed": manifest["seed"],
        "dtype": info["dtype"],
        "device": info["device"],
        "corpus": spec,
        "corpus_details": details,
        "n_docs": n_docs,
        "docs_requested": manifest["docs"],
        "short_docs": manifest["short_docs"],
        "short_docs_policy": describe_policy(manifest["short_docs"]),
        "window_stats": stats.as_dict(),
        "window_parts": composite,
        "n_q_heads": layout.n_q_heads,
        "n_kv_heads": layout.n_kv_heads,
        "head_dim": layout.head_dim,
        "n_layers": int(text_config.num_hidden_layers),
        "eligible_layers": layout.eligible_layers,
        "excluded_layers": layout.excluded(),
        "heads_requested": plan.requested,
        "heads_eligible": plan.n_eligible,
        "head_sampling": (
            "numpy.random.default_rng(seed).choice without replacement over (eligible layer, q_head) pairs in "
            "(layer, q_head) order, all if fewer than requested; kv_head = q_head // (n_q_heads / n_kv_heads)"
        ),
        "position_sampling": (
            "each position of [0, seq_len) kept with probability samples_per_bucket / bucket_size from "
            "numpy.random.default_rng(SeedSequence([seed, *uint32 words of sha256(doc id)])); buckets below "
            "min_per_bucket topped up uniformly without replacement; same positions for q and k"
        ),
        "capture_point": (
            "query/key as passed to the attention kernel: after projection, q/k norm and rotary embedding, "
            "before grouped-query repetition; rows copied to float32 on the CPU"
        ),
        "attn_implementation": f"{capturer.attn_name} (delegating to {capturer.attn})",
        "rope_scaling": info.get("rope_scaling"),
        "rope_parameters": getattr(text_config, "rope_parameters", None),
        "max_position_embeddings": int(text_config.max_position_embeddings),
        **manifest["versions"],
    }


def run_capture(
    model: str,
    corpus: str,
    out: str | os.PathLike,
    *,
    seq_len: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    rope_scaling: str | None = None,
    revision: str | None = None,
    text_field: str = "text",
    id_field: str = "id",
    **options,
) -> xr.Dataset:
    """Load a model and a corpus by name and :func:`capture` into ``out``.

    Parameters
    ----------
    model : str
        ``smollm2-135m``, a local checkpoint directory or a hub id (see :mod:`qkplast.models`).
    corpus : str
        A corpus specification (see :func:`qkplast.corpus.open_corpus`).
    out : path
        Capture file to write.
    seq_len : int, optional
        Defaults to the model's maximum positions, capped at 131072 (the thesis's length).
    device, dtype, rope_scaling, revision
        See :func:`qkplast.models.load_model`.
    text_field, id_field : str
        Fields of ``.jsonl`` records and dataset rows.
    **options
        Passed to :func:`capture` (bucket_size, heads, seed, docs, ...).
    """
    from .corpus import open_corpus
    from .models import load_model

    out = Path(out)
    # Output and corpus problems are reported before the (slow) model load.
    _check_output(out, options.get("overwrite", False))
    documents = open_corpus(corpus, text_field=text_field, id_field=id_field)
    loaded = load_model(
        model, device=device, dtype=dtype, rope_scaling=rope_scaling, revision=revision, seq_len=seq_len
    )
    if seq_len is None:
        seq_len = min(loaded.info["max_positions"], 131072)
    return capture(loaded.model, loaded.tokenizer, documents, out, seq_len=seq_len, model_info=loaded.info, **options)

"""The recorder a capture installs in the attention hook (:mod:`qkplast.capture.hooks`) for one window.

At every entry-point call of a sampled layer it copies the sampled rows of the
planned heads (``index_select`` on the sequence, then on the head axis, so no
more than the sampled rows is ever copied), checks them for NaN/Inf, and
moves them to the CPU as float32. Once the last planned layer's rows are copied
the forward pass stops there: nothing after that point (the rest of that layer,
the layers above it, the final norm) can change a captured row, so a capture
of the first layers costs only those layers (:meth:`Capturer.capture_window`).

Index tensors follow the query: a model spread over several GPUs
(``device_map="auto"``) hands each layer's query on that layer's device, so
the recorder keeps one copy of its indices per device (:class:`DeviceIndexCache`),
made the first time a query arrives from that device.
"""

from __future__ import annotations

import numpy as np

from qkplast.capture.hooks import attention_switched, recording_into, register_capture_attention, text_decoder
from qkplast.capture_format import CaptureError
from qkplast.capture.kernel_guard import check_kernel, device_capability, restricted_sdpa
from qkplast.capture.architecture import inspect_model
from qkplast.capture.sampling import sample_heads

__all__ = ["CaptureComplete", "Capturer", "DeviceIndexCache", "NonFiniteCaptureError", "WindowRecorder"]


class NonFiniteCaptureError(CaptureError):
    """A captured query or key vector holds NaN or Inf."""


class CaptureComplete(Exception):
    """Raised inside the forward pass once every planned layer has been reached; caught by :class:`Capturer`.

    Not an error: it ends the forward at the point after which nothing captured can change.
    """


class DeviceIndexCache:
    """Index tensors (positions and per-layer head indices), copied once per device they are asked for on.

    Parameters
    ----------
    positions : numpy.ndarray
        Sorted sampled positions ``[sample]``.
    heads : dict
        ``layer -> (q_head indices, kv_head indices)`` as numpy arrays.
    """

    def __init__(self, positions: np.ndarray, heads: dict[int, tuple[np.ndarray, np.ndarray]]):
        self._positions = np.asarray(positions, dtype=np.int64)
        self._heads = {layer: (np.asarray(q, np.int64), np.asarray(kv, np.int64)) for layer, (q, kv) in heads.items()}
        self._by_device: dict = {}

    @staticmethod
    def key(device) -> str:
        """The cache key of ``device``: ``torch.device`` and its string spelling give the same key."""
        import torch

        return str(torch.device(device))

    def on(self, device) -> tuple[object, dict[int, tuple[object, object]]]:
        """``(positions, {layer: (q_idx, kv_idx)})`` as long tensors on ``device``, made at the first request."""
        import torch

        key = self.key(device)
        if key not in self._by_device:
            target = torch.device(device)
            positions = torch.as_tensor(self._positions, device=target)  # [sample]
            heads = {
                layer: (torch.as_tensor(q, device=target), torch.as_tensor(kv, device=target))  # [head in layer]
                for layer, (q, kv) in self._heads.items()
            }
            self._by_device[key] = (positions, heads)
        return self._by_device[key]

    @property
    def devices(self) -> list[str]:
        """Keys of the devices index tensors were made for, in order of first request."""
        return list(self._by_device)


class WindowRecorder:
    """Copies the sampled rows of the planned heads when the entry point is called during one forward.

    Parameters
    ----------
    layout : qkplast.capture.architecture.ArchitectureSpec
    plan : qkplast.capture.sampling.HeadPlan
    positions : numpy.ndarray
        Sorted sampled positions of this window.
    doc_id : str
        Named in the error when a vector is not finite.
    on_call : callable, optional
        Called at every entry-point call (progress reporting).
    """

    def __init__(self, layout, plan, positions: np.ndarray, *, doc_id: str = "", on_call=None):
        heads = {}
        for layer in np.unique(plan.layer):
            sel = plan.layer == layer
            heads[int(layer)] = (plan.q_head[sel], plan.kv_head[sel])
        self.indices = DeviceIndexCache(positions, heads)
        self.doc_id = doc_id
        self.on_call = on_call
        self.by_module = {mid: layer for mid, layer in layout.modules.items() if layer in heads}
        self.q_heads = {layer: q for layer, (q, _) in heads.items()}
        self.q: dict[int, object] = {}
        self.k: dict[int, object] = {}

    def observe(self, module, query, key, kwargs):
        import torch

        if self.on_call is not None:
            self.on_call()
        layer = self.by_module.get(id(module))
        if layer is None:
            return
        positions, heads = self.indices.on(query.device)
        q_idx, kv_idx = heads[layer]
        if key.device != query.device:
            positions_k, heads_k = self.indices.on(key.device)
            kv_idx = heads_k[layer][1]
        else:
            positions_k = positions
        # Rows first, then heads: never copies more than the sampled rows of the whole sequence.
        q = query[0].index_select(1, positions).index_select(0, q_idx)  # [head, sample, dim]
        k = key[0].index_select(1, positions_k).index_select(0, kv_idx)  # [head, sample, dim]
        self._check_finite(layer, q, k)
        self.q[layer] = q.to(dtype=torch.float32).cpu()
        self.k[layer] = k.to(dtype=torch.float32).cpu()
        if len(self.q) == len(self.q_heads):
            raise CaptureComplete  # the last planned layer: the rest of the forward cannot change a captured row

    def _check_finite(self, layer: int, q, k) -> None:
        import torch

        finite = torch.isfinite(q).flatten(1).all(1) & torch.isfinite(k).flatten(1).all(1)  # [head in layer]
        if not bool(finite.all()):
            bad = self.q_heads[layer][~finite.cpu().numpy()]
            raise NonFiniteCaptureError(
                f"document {self.doc_id!r}, layer {layer}, q_head(s) {bad.tolist()}: the captured query or key "
                "holds NaN or Inf (overflow in a low-precision dtype?); rerun with --dtype float32 or bfloat16; "
                "the parts of documents already finished are kept and a rerun resumes after them"
            )

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """``q, k`` as float32 ``[head, sample, dim]`` in plan order (layers ascending)."""
        import torch

        missing = sorted(set(self.q_heads) - set(self.q))
        if missing:
            raise CaptureError(f"layers {missing} did not reach the capture entry point during the forward pass")
        order = sorted(self.q_heads)
        q = torch.cat([self.q[layer] for layer in order]).numpy()  # [head, sample, dim]
        k = torch.cat([self.k[layer] for layer in order]).numpy()  # [head, sample, dim]
        return q, k


class Capturer:
    """Capture context for one model: switches the text decoder to the capture entry point while open.

    On construction the model is probed (:func:`qkplast.capture.architecture.inspect_model`)
    and the heads are sampled (:func:`qkplast.capture.sampling.sample_heads`). Inside
    ``with capturer:``, :meth:`capture_window` runs one forward pass and
    returns the sampled rows.

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

    @property
    def calls_per_window(self) -> int:
        """Attention calls one :meth:`capture_window` makes: one per layer up to the last planned one, where the
        forward stops (the length of a window's progress bar)."""
        return min(self.layout.calls_per_forward, int(np.max(self.plan.layer)) + 1)

    def check_kernel(self, seq_len: int) -> None:
        """Refuse (:class:`qkplast.capture.kernel_guard.KernelError`) a kernel whose memory would grow as ``seq_len^2``."""
        device = self.decoder.device
        check_kernel(
            self.attn, self.model.dtype, device.type, device_capability(device), seq_len,
            self.layout.n_q_heads, self.layout.n_kv_heads,
        )

    def __enter__(self):
        self._switch = attention_switched(self.decoder, self.attn_name)
        self._switch.__enter__()
        return self

    def __exit__(self, *exc):
        switch, self._switch = self._switch, None
        return switch.__exit__(*exc)

    def capture_window(self, input_ids: np.ndarray, positions: np.ndarray, *, doc_id: str = "", on_call=None):
        """Run one forward pass over ``input_ids`` and return the sampled Q and K rows.

        The pass stops once the last planned layer's rows are copied (its attention kernel, the layers
        above it and the final norm never run: they cannot change a captured row).

        Parameters
        ----------
        input_ids : numpy.ndarray
            Token ids, shape ``[seq]``.
        positions : numpy.ndarray
            Sorted positions to keep, shape ``[sample]``.
        doc_id : str
            Named when a captured vector is not finite.
        on_call : callable, optional
            Called at every entry-point call (progress reporting).

        Returns
        -------
        q, k : numpy.ndarray
            ``float32``, shape ``[head, sample, head_dim]``, heads in plan order.

        Raises
        ------
        NonFiniteCaptureError
            A captured vector holds NaN or Inf (named by document, layer and head).
        """
        import torch

        if self._switch is None:
            raise CaptureError("Capturer.capture_window must run inside 'with capturer:'")
        recorder = WindowRecorder(self.layout, self.plan, positions, doc_id=doc_id, on_call=on_call)
        device = self.decoder.device
        ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long, device=device)[None]  # [batch, seq]
        with recording_into(recorder), torch.inference_mode(), restricted_sdpa(device.type, ids.shape[1]):
            try:
                self.decoder(input_ids=ids, use_cache=False)
            except CaptureComplete:
                pass  # every planned layer copied: the forward stopped at the last one's attention call
        return recorder.result()

    def bare_forward(self, input_ids: np.ndarray) -> None:
        """The forward pass :meth:`capture_window` replaces, without the capture: the model's own attention
        kernel, nothing copied, stopped where a capture stops (at the last planned layer's attention module,
        before its projections), so timing both measures what the capture's hook and copies cost.

        Runs outside ``with capturer:`` (the decoder keeps its own attention implementation).
        """
        import torch

        if self._switch is not None:
            raise CaptureError("Capturer.bare_forward runs outside 'with capturer:' (the model's own attention)")
        last = int(np.max(self.plan.layer))
        module = next(m for m in self.decoder.modules() if self.layout.modules.get(id(m)) == last)

        def stop(*_):
            raise CaptureComplete

        device = self.decoder.device
        ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long, device=device)[None]  # [batch, seq]
        handle = module.register_forward_pre_hook(stop)
        try:
            with torch.inference_mode(), restricted_sdpa(device.type, ids.shape[1]):
                self.decoder(input_ids=ids, use_cache=False)
        except CaptureComplete:
            pass  # stopped where the capture stops
        finally:
            handle.remove()

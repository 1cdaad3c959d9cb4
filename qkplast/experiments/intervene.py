"""Interventions on attention heads: ablation and clamping of the positional bias (thesis 7.5, 7.6).

The thesis's analyses are observational; its future work asks for two
interventions, both context managers here, composable with each other and with
the capture (:mod:`qkplast.capture.driver`):

:func:`ablate_heads`
    Replace chosen query heads' attention output by zero or by its mean over a
    reference corpus. The hook sits on the input of the attention module's
    output projection ``o_proj``: in every supported family the attention
    module reshapes the kernel's output ``[batch, seq, n_q, head_dim]`` to
    ``[batch, seq, n_q * head_dim]`` and feeds it to ``o_proj``, so query head
    ``h`` occupies the contiguous slice ``h * head_dim : (h + 1) * head_dim``,
    which is that head's softmax-weighted sum of values -- its attention output
    before the heads are mixed.
:func:`clamp_bias`
    Remove a head's positional bias pathway on the drift axis ``a`` of the
    planar rotation model (section 4.3, eq. 4.6:
    ``bias_strength = mu_Q^a * alpha_K``), through the attention transform of
    :mod:`qkplast.capture.hooks` (no modeling file patched):

    ``mode="query"``
        the query's a-coordinate is set to ``value`` (default 0), so
        ``mu_Q^a -> value`` for that query head only;
    ``mode="key"``
        the key's linear drift along ``a`` is removed,
        ``k(t) <- k(t) - alpha_K (t - t_0) a``, so ``alpha_K -> 0``. The key
        head is shared by its whole GQA group (eq. 4.1): every query head of
        the group sees the de-drifted keys;
    ``mode="both"``
        both.

    Why re-capture shows the bias gone: the drift axis is the pooled
    covariance ``Cov(x, t)`` of queries and keys (eq. 4.3). Removing the
    queries' (or the keys') component of that covariance along ``a`` leaves
    the pooled covariance parallel to ``a``, so a re-capture finds the same
    axis, on which ``mu_Q^a`` (or ``alpha_K``) is now zero; heads clamped in
    earlier layers change the residual stream, so this holds up to their
    indirect effect (the tests bound it).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import ExitStack, contextmanager

import numpy as np
import torch
import xarray as xr

from qkplast.errors import QkplastError
from qkplast.capture.hooks import attention_transform, text_decoder

__all__ = [
    "InterventionError",
    "AttentionModules",
    "ablate_heads",
    "head_mean_outputs",
    "clamp_bias",
    "select_heads",
    "composed",
]

ABLATION_MODES = ("zero", "mean")
CLAMP_MODES = ("query", "key", "both")


class InterventionError(QkplastError):
    """An intervention cannot be applied as asked (the message names the fix)."""


class AttentionModules:
    """Attention modules of a model by layer, with the head counts the hooks need.

    Attributes
    ----------
    modules : dict
        ``layer -> attention module`` for every self-attention layer.
    n_layers, n_q_heads, n_kv_heads, head_dim : int
    """

    def __init__(self, model):
        config = model.config.get_text_config()
        self.n_layers = int(config.num_hidden_layers)
        self.n_q_heads = int(config.num_attention_heads)
        self.n_kv_heads = int(config.num_key_value_heads)
        self.modules = {}
        for module in text_decoder(model).modules():
            # Cross-attention layers (Mllama) read image states, never the text: they are not heads to intervene on.
            cross = "CrossAttention" in type(module).__name__
            if hasattr(module, "o_proj") and hasattr(module, "layer_idx") and not cross:
                self.modules[int(module.layer_idx)] = module
        if not self.modules:
            raise InterventionError(
                f"{type(model).__name__} has no attention module with an o_proj and a layer_idx; "
                "interventions support the Llama, Qwen3, Mistral and SmolLM3 families"
            )
        first = next(iter(self.modules.values()))
        self.head_dim = int(getattr(first, "head_dim", config.hidden_size // self.n_q_heads))

    @property
    def group(self) -> int:
        return self.n_q_heads // self.n_kv_heads

    def check(self, heads) -> list[tuple[int, int]]:
        """Validated, de-duplicated, sorted ``(layer, q_head)`` pairs."""
        out = set()
        for item in heads:
            try:
                layer, q_head = (int(x) for x in item)
            except (TypeError, ValueError):
                raise InterventionError(f"heads must be (layer, q_head) pairs of integers, got {item!r}") from None
            if layer not in self.modules:
                layers = sorted(self.modules)
                span = f"0..{layers[-1]}" if layers == list(range(len(layers))) else str(layers)
                raise InterventionError(f"unknown layer {layer}: the model's self-attention layers are {span}; "
                                        "fix the head list")
            if not 0 <= q_head < self.n_q_heads:
                raise InterventionError(
                    f"unknown query head {q_head} in layer {layer}: the model has query heads 0..{self.n_q_heads - 1}; "
                    "fix the head list")
            out.add((layer, q_head))
        return sorted(out)


def heads_by_layer(heads: Sequence[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for layer, q_head in heads:
        out.setdefault(layer, []).append(q_head)
    return out


def _fill_pre_hook(q_heads: list[int], head_dim: int, fill: torch.Tensor | None):
    """An ``o_proj`` forward pre-hook replacing the heads' slices by zero or by ``fill`` ``[head, dim]``."""
    index = torch.as_tensor(q_heads)

    def hook(module, args):
        x = args[0]  # [batch, seq, n_q * head_dim]
        y = x.clone().unflatten(-1, (-1, head_dim))  # [batch, seq, n_q, head_dim]
        idx = index.to(x.device)
        y[..., idx, :] = 0 if fill is None else fill.to(device=x.device, dtype=x.dtype)
        return (y.flatten(-2), *args[1:])

    return hook


def _as_mean_tensor(reference, layout: AttentionModules) -> torch.Tensor:
    if isinstance(reference, xr.DataArray):
        reference = reference.values
    ref = torch.as_tensor(np.asarray(reference, dtype=np.float64))
    want = (layout.n_layers, layout.n_q_heads, layout.head_dim)
    if tuple(ref.shape) != want:
        raise InterventionError(
            f"reference mean has shape {tuple(ref.shape)}, the model needs {want} (layer, q_head, head_dim); "
            "compute it with qkplast.experiments.intervene.head_mean_outputs(model, windows)")
    if not torch.isfinite(ref).all():
        raise InterventionError("reference mean holds NaN or Inf; recompute it with head_mean_outputs")
    return ref


def _is_windows(reference) -> bool:
    if isinstance(reference, (xr.DataArray, torch.Tensor)):
        return False
    if isinstance(reference, np.ndarray):
        return reference.dtype.kind in "iu"
    return isinstance(reference, (list, tuple)) and len(reference) > 0


def head_mean_outputs(model, windows: Iterable, *, batch_size: int = 1) -> xr.DataArray:
    """Mean attention output of every query head over all positions of ``windows``.

    The mean is taken in float64 over the ``o_proj`` input slices (see module
    docstring) of every token of every window, one forward per batch.

    Parameters
    ----------
    windows : iterable of token-id arrays or :class:`qkplast.capture.corpus.Window`
        Reference corpus, each ``[seq]``.

    Returns
    -------
    xarray.DataArray
        Dims ``layer, q_head, dim``.
    """
    layout = AttentionModules(model)
    rows = [np.asarray(getattr(w, "input_ids", w), dtype=np.int64) for w in windows]
    if not rows:
        raise InterventionError("head_mean_outputs needs at least one reference window")
    total = torch.zeros(layout.n_layers, layout.n_q_heads, layout.head_dim, dtype=torch.float64)
    count = 0
    handles = []

    def collect(layer):
        def hook(module, args):
            x = args[0].detach().double().unflatten(-1, (-1, layout.head_dim))  # [batch, seq, n_q, head_dim]
            total[layer] += x.sum((0, 1)).cpu()

        return hook

    dev = next(model.parameters()).device
    try:
        for layer, module in layout.modules.items():
            handles.append(module.o_proj.register_forward_pre_hook(collect(layer)))
        with torch.inference_mode():
            for s in range(0, len(rows), batch_size):
                if len({len(r) for r in rows[s: s + batch_size]}) != 1:
                    raise InterventionError("reference windows in one batch differ in length; use batch_size=1")
                ids = torch.as_tensor(np.stack(rows[s: s + batch_size]), device=dev)  # [batch, seq]
                text_decoder(model)(input_ids=ids, use_cache=False)
                count += ids.numel()
    finally:
        for h in handles:
            h.remove()
    return xr.DataArray((total / count).numpy(), dims=("layer", "q_head", "dim"),
                        coords={"layer": np.arange(layout.n_layers), "q_head": np.arange(layout.n_q_heads)},
                        attrs={"tokens": count, "meaning": "mean o_proj input slice per query head"})


@contextmanager
def ablate_heads(model, heads, mode: str = "zero", reference=None):
    """Run ``model`` with the attention output of ``heads`` replaced while open.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    heads : list of (layer, q_head)
        Query heads to ablate; an empty list changes nothing (no hook is registered).
    mode : {"zero", "mean"}
        Zero ablation, or mean ablation (the head's output replaced by its mean
        over a reference corpus, which keeps the average signal the rest of the
        network expects while removing what depends on the input).
    reference : token windows, or array/DataArray ``[layer, q_head, head_dim]``
        For ``mode="mean"``: windows to average over (see
        :func:`head_mean_outputs`), or a precomputed mean.

    Notes
    -----
    Forward pre-hooks on ``o_proj`` are removed on exit, so the model computes
    exactly what it did before (bit for bit).
    """
    if mode not in ABLATION_MODES:
        raise InterventionError(f"ablation mode must be one of {ABLATION_MODES}, got {mode!r}")
    layout = AttentionModules(model)
    heads = layout.check(heads)
    if mode == "zero" and reference is not None:
        raise InterventionError("reference is only used with mode='mean'; drop it or pass mode='mean'")
    mean = None
    if mode == "mean":
        if reference is None:
            raise InterventionError("mode='mean' needs reference= token windows or a precomputed head_mean_outputs()")
        mean = _as_mean_tensor(head_mean_outputs(model, reference) if _is_windows(reference) else reference, layout)
    handles = []
    try:
        for layer, q_heads in heads_by_layer(heads).items():
            fill = None if mean is None else mean[layer, q_heads]  # [head, head_dim]
            hook = _fill_pre_hook(q_heads, layout.head_dim, fill)
            handles.append(layout.modules[layer].o_proj.register_forward_pre_hook(hook))
        yield heads
    finally:
        for h in handles:
            h.remove()


# --------------------------------------------------------------------------- clamp


def metrics_head_index(metrics: xr.Dataset, layout: AttentionModules) -> dict[tuple[int, int], int]:
    """``(layer, q_head) -> index`` of ``metrics``, after checking that they describe this model."""
    for name in ("axis_a", "alpha_k", "layer", "q_head", "kv_head"):
        if name not in metrics.variables:
            raise InterventionError(f"metrics lack {name!r}; pass the output of qkplast.analyze (rotation model, 4.3)")
    recorded = metrics.attrs.get("capture", {}) if isinstance(metrics.attrs.get("capture"), dict) else {}
    model_dims = {"n_q_heads": layout.n_q_heads, "n_kv_heads": layout.n_kv_heads, "head_dim": layout.head_dim,
                  "n_layers": layout.n_layers}
    wrong = [f"{k} {recorded[k]} vs {v}" for k, v in model_dims.items() if k in recorded and int(recorded[k]) != v]
    layer, q_head, kv_head = (metrics[c].values.astype(int) for c in ("layer", "q_head", "kv_head"))
    if metrics.sizes.get("dim") != layout.head_dim:
        wrong.append(f"head_dim {metrics.sizes.get('dim')} vs {layout.head_dim}")
    if (layer >= layout.n_layers).any() or (layer < 0).any() or (q_head >= layout.n_q_heads).any():
        wrong.append("head coords outside the model's layers/heads")
    elif not np.array_equal(kv_head, q_head // layout.group):
        wrong.append("kv_head coords do not follow this model's GQA grouping")
    if wrong:
        raise InterventionError(
            f"metrics come from another model ({'; '.join(wrong)}); analyse a capture of this model "
            "(qkplast.analyze(capture)) and pass those metrics")
    return {(int(lay), int(h)): i for i, (lay, h) in enumerate(zip(layer, q_head))}


def clamp_tensors(metrics: xr.Dataset, heads, index, layout: AttentionModules):
    """Per layer: query heads with axes ``[m, d]``; key heads with drift vectors ``[g, d]`` (float64)."""
    missing = [h for h in heads if h not in index]
    if missing:
        raise InterventionError(
            f"heads {missing} are not in metrics (only captured heads have a drift axis); capture them "
            "(heads=None captures all) or choose heads from metrics")
    axes = np.asarray(metrics["axis_a"].values, dtype=np.float64)  # [head, dim]
    alpha = np.asarray(metrics["alpha_k"].values, dtype=np.float64)  # [head]
    per_layer = {}
    for layer, q_heads in heads_by_layer(heads).items():
        rows = [index[(layer, h)] for h in q_heads]
        a, al = axes[rows], alpha[rows]  # [m, dim], [m]
        bad = [(layer, h) for h, r in zip(q_heads, range(len(rows))) if not (np.isfinite(a[r]).all()
                                                                           and np.isfinite(al[r]))]
        if bad:
            raise InterventionError(
                f"heads {bad} have no drift axis (axis_a or alpha_k is NaN: no position covariance was measured); "
                "leave them out or capture more positions")
        per_layer[layer] = _layer_entry(q_heads, a, al, layout.group)
        if "key_drift" in metrics:  # a calibrated clamp (calibrate_clamp) carries its key drifts whole
            drift = np.asarray(metrics["key_drift"].values, dtype=np.float64)[rows]  # [m, dim]
            kv = np.asarray(q_heads) // layout.group
            groups = per_layer[layer][2].numpy()
            per_layer[layer] = per_layer[layer][:3] + (torch.as_tensor(np.stack(
                [drift[np.flatnonzero(kv == g)[0]] for g in groups])),)
    return per_layer


def _group_drift(axes: np.ndarray, alpha: np.ndarray, kv: np.ndarray) -> dict[int, np.ndarray]:
    """Per key head: the minimum-norm ``v`` with ``a_i . v = alpha_K,i`` for each clamped query head ``i`` it serves.

    One shared key head, possibly several axes: removing ``t v`` from its keys makes every one of those
    heads' key slopes along its own axis zero (eq. 4.1: the key head is shared by its GQA group).
    """
    return {int(g): np.linalg.lstsq(axes[kv == g], alpha[kv == g], rcond=None)[0] for g in np.unique(kv)}


def _layer_entry(q_heads, axes: np.ndarray, alpha: np.ndarray, group: int):
    """The tensors one layer's clamp needs: query heads, their axes ``[m, d]``, key heads and drifts ``[g, d]``."""
    drift = _group_drift(axes, alpha, np.asarray(q_heads) // group)
    return (torch.as_tensor(q_heads), torch.as_tensor(axes), torch.as_tensor(sorted(drift)),
            torch.as_tensor(np.stack([drift[g] for g in sorted(drift)])))


def apply_clamp(query, key, entry, mode: str, value: float, t0: float):
    """``query`` ``[batch, n_q, seq, dim]`` and ``key`` ``[batch, n_kv, seq, dim]`` with one layer's clamp applied."""
    q_idx, axes, kv_idx, drift = entry
    if mode in ("query", "both"):
        a = axes.to(device=query.device, dtype=torch.float32)  # [m, dim]
        q = query[:, q_idx.to(query.device)].float()  # [batch, m, seq, dim]
        coord = torch.einsum("bmsd,md->bms", q, a)  # [batch, m, seq]
        q = q + (value - coord)[..., None] * a[None, :, None, :]
        query = query.clone()
        query[:, q_idx.to(query.device)] = q.to(query.dtype)
    if mode in ("key", "both"):
        t = torch.arange(key.shape[2], device=key.device, dtype=torch.float32) - t0  # [seq]
        dv = drift.to(device=key.device, dtype=torch.float32)  # [g, dim]
        k = key[:, kv_idx.to(key.device)].float()  # [batch, g, seq, dim]
        k = k - t[None, None, :, None] * dv[None, :, None, :]
        key = key.clone()
        key[:, kv_idx.to(key.device)] = k.to(key.dtype)
    return query, key


def _clamp_transform(layout: AttentionModules, per_layer: dict, mode: str, value: float, t0: float):
    layer_of = {id(m): layer for layer, m in layout.modules.items()}

    def transform(module, query, key, v, mask, kwargs):
        layer = layer_of.get(id(module))
        if layer not in per_layer:
            return query, key, v, mask
        query, key = apply_clamp(query, key, per_layer[layer], mode, value, t0)
        return query, key, v, mask

    return transform


@contextmanager
def clamp_bias(model, metrics: xr.Dataset, heads, mode: str = "query", *, value: float = 0.0):
    """Remove the positional bias pathway of ``heads`` on their drift axis while open (eq. 4.6).

    Parameters
    ----------
    model : transformers.PreTrainedModel
    metrics : xarray.Dataset
        Output of :func:`qkplast.analyze` on a capture of this model (``axis_a``,
        ``alpha_k``, head coords ``layer``/``q_head``/``kv_head``).
    heads : list of (layer, q_head)
        Heads to clamp; an empty list changes nothing.
    mode : {"query", "key", "both"}
        ``"query"``: the query head's coordinate on ``a`` is set to ``value``
        (``mu_Q^a -> value``; that query head only). ``"key"``: the key drift
        along ``a`` is removed (``alpha_K -> 0``), on the shared key head, so
        the whole GQA group is affected. See the module docstring.
    value : float
        The constant query coordinate of ``mode="query"`` (0 removes the
        pathway; another value sets ``bias_strength = value * alpha_K``).

    Notes
    -----
    The key position ``t`` is the key's index in the sequence (no cache, no
    left padding); ``t_0`` is the mean captured position ``(seq_len - 1)/2`` of
    the metrics' capture. ``t_0`` shifts every key's score by the same amount
    for a given query, which softmax ignores.
    """
    if mode not in CLAMP_MODES:
        raise InterventionError(f"clamp mode must be one of {CLAMP_MODES}, got {mode!r}")
    layout = AttentionModules(model)
    heads = layout.check(heads)
    index = metrics_head_index(metrics, layout)
    if not heads:
        yield heads
        return
    _check_calibration(metrics, heads, mode)
    per_layer = clamp_tensors(metrics, heads, index, layout)
    seq_len = (metrics.attrs.get("capture") or {}).get("seq_len") if isinstance(metrics.attrs.get("capture"), dict) \
        else None
    t0 = (float(seq_len) - 1) / 2 if seq_len else 0.0
    delegate = "eager" if text_decoder(model).config._attn_implementation.endswith("eager") else "sdpa"
    with attention_transform(model, _clamp_transform(layout, per_layer, mode, float(value), t0), delegate=delegate):
        yield heads


def _check_calibration(metrics: xr.Dataset, heads, mode: str) -> None:
    """A calibrated clamp holds only for the heads and mode it was calibrated with (the layers below differ)."""
    cal = metrics.attrs.get("clamp_calibration")
    if not isinstance(cal, dict):
        return
    calibrated = sorted(tuple(int(x) for x in h) for h in cal.get("heads", []))
    if calibrated != list(heads) or cal.get("mode") != mode:
        raise InterventionError(
            f"these metrics are a clamp calibrated for mode {cal.get('mode')!r} and heads {calibrated}, not for mode "
            f"{mode!r} and heads {list(heads)}; calibrate those (calibrate_clamp) or pass the plain metrics")


# --------------------------------------------------------------------------- head choice


def select_heads(metrics: xr.Dataset, k: int, by: str, *, largest: bool = False, absolute: bool = False,
                 seed: int | None = None) -> list[tuple[int, int]]:
    """The ``k`` heads of ``metrics`` ranked by variable ``by`` (or ``k`` uniformly random ones).

    ``by="random"`` draws ``k`` heads without replacement with
    ``numpy.random.default_rng(seed)``; otherwise heads with a NaN in ``by``
    are skipped and ties keep the (layer, q_head) order.
    """
    layer, q_head = metrics["layer"].values.astype(int), metrics["q_head"].values.astype(int)
    if not 0 <= k <= len(layer):
        raise InterventionError(f"k must lie in 0..{len(layer)} (heads in metrics), got {k}")
    if by == "random":
        pick = np.random.default_rng(seed).choice(len(layer), size=k, replace=False)
    else:
        if by not in metrics:
            raise InterventionError(f"metrics have no variable {by!r} to rank heads by")
        score = np.asarray(metrics[by].values, dtype=np.float64)
        score = np.abs(score) if absolute else score
        ok = np.flatnonzero(np.isfinite(score))
        order = ok[np.argsort(-score[ok] if largest else score[ok], kind="stable")]
        pick = order[:k]
    return sorted((int(layer[i]), int(q_head[i])) for i in pick)


def composed(*managers):
    """Enter several intervention context managers as one (in order)."""

    @contextmanager
    def _all():
        with ExitStack() as stack:
            yield [stack.enter_context(m) for m in managers]

    return _all()


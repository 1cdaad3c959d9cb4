"""Calibration of the bias clamp: each clamped layer measured under the clamps of the layers below it.

:func:`qkplast.experiments.intervene.clamp_bias` built from a run's metrics uses each
head's drift axis ``a`` and key slope ``alpha_K`` (section 4.3, eq. 4.6) as
the *plain* model has them. A head above another clamped head receives a
residual stream the lower clamp changed, so its axis moves and part of its
bias survives; and a key head serving several clamped query heads (eq. 4.1)
cannot zero every one's slope with the one-step drift. :func:`calibrate_clamp`
runs one forward pass over calibration windows in which every clamped layer,
in order, is measured on the queries and keys as they arrive and then clamped
with what was measured. :func:`capture_windows` gives the windows and sampled
positions a capture draws, so a re-capture there finds no bias left.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import numpy as np
import torch
import xarray as xr

from qkplast.tensors import to_numpy
from qkplast.capture.hooks import attention_transform, text_decoder
from qkplast.experiments.intervene import (CLAMP_MODES, AttentionModules, InterventionError, apply_clamp, heads_by_layer, clamp_tensors,
                        metrics_head_index)

__all__ = ["calibrate_clamp", "calibrate_and_capture", "calibrating", "capture_windows"]

#: iterations of the key-drift solve for a key head shared by several clamped query heads
_DRIFT_ITERATIONS = 50


def _head_statistics(q, k, t, w):
    """Centred position sums of one layer's clamped heads over the weighted positions.

    ``q`` ``[m, batch, seq, dim]`` (the clamped query heads), ``k`` ``[m, batch, seq, dim]`` (each one's key
    head), ``t`` ``[seq]``, ``w`` ``[batch, seq]`` 0/1 weights of the measured positions. Returns
    ``sq``, ``sk`` ``[m, dim]`` (``sum w (x - mean) (t - t_bar)``), ``mean_q`` ``[m, dim]`` and ``stt``.
    """
    n = w.sum()
    tc = (t[None, :] - (w * t[None, :]).sum() / n) * w  # [batch, seq], zero off the measured positions
    stt = (tc * tc).sum()
    mean_q = torch.einsum("mbsd,bs->md", q, w) / n
    sq = torch.einsum("mbsd,bs->md", q, tc)  # sum over measured positions of q (t - t_bar): centring q is implied
    sk = torch.einsum("mbsd,bs->md", k, tc)
    return sq, sk, mean_q, stt


def calibrated_drift(sq: torch.Tensor, sk: torch.Tensor, stt: torch.Tensor) -> torch.Tensor:
    """Drift ``v`` ``[dim]`` of one key head so that every clamped query head it serves has ``alpha_K = 0``
    on the axis a re-capture will find.

    After ``k(t) <- k(t) - (t - t_0) v`` the key sums become ``u = sk - stt v`` and head ``i``'s axis
    ``a_i' = unit(sq_i + u)`` (eq. 4.3). One head: ``v = alpha_K a`` solves ``a_i' . u = 0`` at once. Several
    heads sharing the key head: the minimum-norm linear step is repeated with the moved axes until every
    ``a_i' . u`` is below ``1e-12`` of ``|sk|`` (or :data:`_DRIFT_ITERATIONS` steps).
    """
    u = sk[0].clone()
    for _ in range(_DRIFT_ITERATIONS):
        axes = _unit_rows(sq + u)  # [m, dim]
        resid = axes @ u  # [m]
        if float(resid.abs().max()) <= 1e-12 * float(torch.linalg.vector_norm(sk[0])):
            break
        u = u - torch.linalg.lstsq(axes, resid[:, None]).solution[:, 0]
    return (sk[0] - u) / stt


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True)


def calibrate_clamp(model, metrics: xr.Dataset, heads, input_ids, mode: str = "query", *, positions=None,
                    value: float = 0.0) -> xr.Dataset:
    """The clamp's axes and key drifts re-measured layer by layer, each under the clamps of the layers below.

    :func:`clamp_bias` built from ``metrics`` uses each head's axis ``a`` and
    ``alpha_K`` as the plain model has them. A head above other clamped heads
    receives a residual stream they changed, so its axis moves and part of its
    bias survives. Here one forward pass over ``input_ids`` measures, at each
    clamped layer in turn, the rotation model (eq. 4.3, 4.6) of that layer's
    clamped heads on the queries and keys as they arrive (the layers below
    already clamped), then clamps that layer with what it measured before the
    pass goes on. A re-capture at the same windows and positions then finds
    ``bias_strength = 0`` up to float32 rounding on every clamped head: in
    ``"query"`` mode exactly (the re-fitted axis is ``a`` again, with the
    query coordinate 0); in ``"key"`` mode a key head serving several clamped
    query heads gets the drift that zeroes all their slopes on their re-fitted
    axes (:func:`calibrated_drift`).

    Parameters
    ----------
    model, metrics, heads, mode, value
        As for :func:`clamp_bias`.
    input_ids : array-like ``[batch, seq]``
        The calibration windows (token ids), run as one batch.
    positions : array-like of bool ``[batch, seq]``, optional
        Where to measure (default: every position). A capture's sampled
        positions make its re-capture at those windows exact.

    Returns
    -------
    xarray.Dataset
        ``metrics`` with ``axis_a``, ``alpha_k``, ``mu_q_a`` and ``bias_strength``
        of the clamped heads replaced by the calibrated values, and
        ``key_drift`` (head, dim: the drift removed from each clamped head's key
        head; NaN elsewhere), which :func:`clamp_bias` then uses as it is.
        ``attrs["clamp_calibration"]`` records the mode, heads, windows and positions.
    """
    ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long)
    if ids.ndim != 2 or ids.shape[1] < 2:
        raise InterventionError(f"input_ids must be [batch, seq] token windows, got shape {tuple(ids.shape)}")
    positions = np.ones(ids.shape, dtype=bool) if positions is None else np.asarray(positions)
    if positions.shape != tuple(ids.shape):
        raise InterventionError(f"positions must be a boolean [batch, seq] mask like input_ids {tuple(ids.shape)}, "
                                f"got shape {positions.shape}")
    decoder = text_decoder(model)
    with calibrating(model, metrics, heads, positions, mode, value=value, stop=True) as calibration:
        try:
            with torch.inference_mode():
                decoder(input_ids=ids.to(decoder.device), use_cache=False)
        except _CalibrationDone:
            pass
    return calibration.result()


def calibrate_and_capture(model, tokenizer, corpus, metrics: xr.Dataset, heads, options, mode: str = "query", *,
                          value: float = 0.0) -> tuple[xr.Dataset, xr.Dataset]:
    """:func:`calibrate_clamp` on a capture's one window, and the capture under the calibrated clamp, in one pass.

    The calibrating pass clamps each layer with what it measured before the
    pass goes on, so the Q/K it hands the capture recorder further up are
    those a later capture inside ``clamp_bias(model, calibrated, heads, mode)``
    records at this window: the re-capture costs no second forward pass.

    Parameters
    ----------
    options : CaptureOptions
        The capture's settings, with ``docs=1`` (several windows are calibrated
        as one batch, which a capture does not run: use :func:`calibrate_clamp`
        and then a capture inside :func:`clamp_bias`).

    Returns
    -------
    calibrated, capture : xarray.Dataset
        As :func:`calibrate_clamp` returns, and the capture of ``options`` under the clamp.
    """
    from qkplast.capture.driver import capture as run_capture

    if options.docs != 1:
        raise InterventionError(f"calibrate_and_capture runs one window (options.docs=1), got docs={options.docs}; "
                                "for more, calibrate_clamp on all of them and then capture inside clamp_bias")
    _, mask = capture_windows(tokenizer, corpus, options)  # the positions the capture will sample
    with calibrating(model, metrics, heads, mask, mode, value=value) as calibration:
        again = run_capture(model, tokenizer, corpus, options=options, progress=False)
    return calibration.result(), again


class _Calibration:
    """What one calibrating pass measured, layer by layer; :meth:`result` turns it into calibrated metrics."""

    def __init__(self, metrics, index, mode, shape, n_positions, wanted):
        self.metrics, self.index, self.mode, self.shape, self.n_positions = metrics, index, mode, shape, n_positions
        self.wanted = wanted
        self.measured: dict[tuple[int, int], dict] = {}
        self.per_layer: dict[int, tuple] = {}

    def result(self) -> xr.Dataset:
        if len(self.per_layer) != len(self.wanted):
            raise InterventionError(f"layers {sorted(set(self.wanted) - set(self.per_layer))} did not run attention "
                                    f"on a {self.shape[0]}x{self.shape[1]} window during the calibration forward; "
                                    "clamp heads of self-attention layers only")
        return _calibrated_metrics(self.metrics, self.index, self.measured, self.mode, self.shape, self.n_positions)


@contextmanager
def calibrating(model, metrics: xr.Dataset, heads, positions, mode: str = "query", *, value: float = 0.0,
                stop: bool = False):
    """While open, the forward pass over windows shaped like ``positions`` calibrates the clamp and runs clamped.

    Each clamped layer is measured on the first attention call whose queries
    have ``positions``' ``[batch, seq]`` shape (a shorter probe pass, as
    :func:`qkplast.capture.driver.capture` runs to learn the layout, goes through
    unclamped), then clamped with what it measured, for that call and every
    later one. With ``stop=True`` the pass is stopped (``_CalibrationDone``)
    once the highest clamped layer is measured. Yields a :class:`_Calibration`
    whose ``result()`` is what :func:`calibrate_clamp` returns.
    """
    if mode not in CLAMP_MODES:
        raise InterventionError(f"clamp mode must be one of {CLAMP_MODES}, got {mode!r}")
    layout = AttentionModules(model)
    heads = layout.check(heads)
    index = metrics_head_index(metrics, layout)
    w = torch.as_tensor(np.asarray(positions), dtype=torch.float64)  # [batch, seq]
    if w.ndim != 2 or int((w > 0).sum()) < 3:
        raise InterventionError(f"positions must be a boolean [batch, seq] mask like input_ids, got shape "
                                f"{tuple(w.shape)} with {int((w > 0).sum())} positions; mark at least 3")
    clamp_tensors(metrics, heads, index, layout)  # the same checks as clamp_bias (heads present, axes finite)
    seq_len = (metrics.attrs.get("capture") or {}).get("seq_len") if isinstance(metrics.attrs.get("capture"), dict) \
        else None
    t0 = (float(seq_len) - 1) / 2 if seq_len else 0.0
    layer_of = {id(m): layer for layer, m in layout.modules.items()}
    state = _Calibration(metrics, index, mode, tuple(w.shape), int((w > 0).sum()), heads_by_layer(heads))

    def transform(module, query, key, v, mask, kwargs):
        layer = layer_of.get(id(module))
        if layer not in state.wanted:
            return query, key, v, mask
        if layer not in state.per_layer:
            if tuple(query.shape[0:1] + query.shape[2:3]) != state.shape:
                return query, key, v, mask  # not the calibration windows (a layout probe): nothing to measure
            _measure(state, layout, layer, query, key, w.to(query.device))
        if stop and len(state.per_layer) == len(state.wanted):
            raise _CalibrationDone  # every clamped layer is measured: the layers above cannot change that
        query, key = apply_clamp(query, key, state.per_layer[layer], mode, float(value), t0)
        return query, key, v, mask

    delegate = "eager" if text_decoder(model).config._attn_implementation.endswith("eager") else "sdpa"
    with attention_transform(model, transform, delegate=delegate):
        yield state


def _measure(state: _Calibration, layout, layer: int, query, key, w):
    """The rotation model (eq. 4.3, 4.6) of ``layer``'s clamped heads at the weighted positions, stored in ``state``."""
    q_heads = state.wanted[layer]
    kv = np.asarray(q_heads) // layout.group
    q = query[:, q_heads].transpose(0, 1).double()  # [m, batch, seq, dim]
    k = key[:, kv.tolist()].transpose(0, 1).double()  # [m, batch, seq, dim]
    t = torch.arange(query.shape[2], dtype=torch.float64, device=query.device)  # [seq]
    sq, sk, mean_q, stt = _head_statistics(q, k, t, w)
    axes = _unit_rows(sq + sk)  # [m, dim] eq. 4.3 (the pooled cloud's position covariance)
    alpha = (axes * sk).sum(-1) / stt  # [m]
    drift = {int(g): calibrated_drift(sq[torch.as_tensor(kv == g)], sk[torch.as_tensor(kv == g)], stt)
             for g in np.unique(kv)}
    for i, h in enumerate(q_heads):
        state.measured[(layer, h)] = {"axis_a": to_numpy(axes[i]), "alpha_k": float(alpha[i]),
                                      "mu_q_a": float(mean_q[i] @ axes[i]), "key_drift": to_numpy(drift[int(kv[i])])}
    groups = sorted(drift)
    state.per_layer[layer] = (torch.as_tensor(q_heads), axes, torch.as_tensor(groups),
                              torch.stack([drift[g] for g in groups]))


class _CalibrationDone(Exception):
    """Raised inside the calibration forward once the highest clamped layer is measured, to stop the pass."""


def capture_windows(tokenizer, corpus, options) -> tuple[np.ndarray, np.ndarray]:
    """The token windows ``[doc, seq]`` a capture with ``options`` runs, and its sampled positions as a mask.

    ``options`` is a :class:`qkplast.CaptureOptions` with ``seq_len`` and
    ``bucket_size`` set; the windows and positions are those
    :func:`qkplast.capture.driver.capture` draws (same cut, same seeded sampler), so
    :func:`calibrate_clamp` on them measures exactly what a re-capture will.
    """
    from qkplast.capture.corpus import iter_windows
    from qkplast.capture.sampling import sample_positions

    if not options.seq_len or not options.bucket_size:
        raise InterventionError("capture_windows needs options with seq_len and bucket_size set")
    windows = list(itertools.islice(iter_windows(corpus, tokenizer, options.seq_len, short_docs=options.short_docs),
                                    options.docs))
    if not windows:
        raise InterventionError(f"the corpus gives no window of {options.seq_len} tokens to calibrate on; "
                                "choose a corpus with longer documents or a shorter seq_len")
    ids = np.stack([w.input_ids for w in windows])  # [doc, seq]
    mask = np.zeros(ids.shape, dtype=bool)
    for row, w in enumerate(windows):
        mask[row, sample_positions(options.seq_len, options.bucket_size, doc_id=w.doc_id, seed=options.seed,
                                   samples_per_bucket=options.samples_per_bucket,
                                   min_per_bucket=options.min_per_bucket)] = True
    return ids, mask


def _calibrated_metrics(metrics: xr.Dataset, index: dict, measured: dict, mode: str, shape, n_positions: int):
    out = metrics.copy(deep=True)
    d = out.sizes["dim"]
    drift = np.full((out.sizes["head"], d), np.nan)
    for head, values in measured.items():
        row = index[head]
        out["axis_a"][row] = values["axis_a"]
        for name in ("alpha_k", "mu_q_a"):
            out[name][row] = values[name]
        out["bias_strength"][row] = values["mu_q_a"] * values["alpha_k"]
        drift[row] = values["key_drift"]
    out["key_drift"] = (("head", "dim"), drift)
    out["key_drift"].attrs["meaning"] = "drift removed from the clamped head's key head by the calibrated key clamp"
    out.attrs["clamp_calibration"] = {"mode": mode, "heads": [list(h) for h in sorted(measured)],
                                      "windows": int(shape[0]), "seq_len": int(shape[1]), "positions": n_positions}
    return out

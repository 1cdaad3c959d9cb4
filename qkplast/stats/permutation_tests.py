"""Permutation tests of the chapter beyond the thesis: GQA groups and listwise plasticity (thesis 7.5).

The statistics are computed in :mod:`qkplast.analysis.gqa` (profile distances, ``T`` = within minus between
group distance, the cross profiles of every query head against every key head of its layer) and
:mod:`qkplast.analysis.listwise` (per-head pairwise and listwise AP, rank correlations); this module draws their
nulls and p-values:

* :func:`gqa_similarity`: ``T`` against key-head labels permuted among the query heads of each layer (group sizes
  kept, layers never mixed); one-sided ``(1 + #{T_perm <= T}) / (1 + n_perm)``.
* :func:`gqa_key_null`: ``T`` against query heads exchanged within layers, each head keeping its own key head (so
  groups still share their keys).
* :func:`pairwise_predicts_listwise`: Spearman's rho across heads of pairwise with listwise AP, and the two-sided
  permutation p of no association.
"""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from qkplast.analysis.gqa import gqa_testable, profile_distances, within_minus_between
from qkplast.analysis.listwise import pairwise_and_listwise, rank_correlation, tied_ranks
from qkplast.tensors import as_f64, resolve_device, to_numpy

__all__ = ["gqa_key_null", "gqa_similarity", "pairwise_predicts_listwise", "within_layer_permutations"]


def within_layer_permutations(layer: np.ndarray, n_perm: int, rng: np.random.Generator) -> np.ndarray:
    """``[perm, head]`` indices: each row permutes the heads within every layer."""
    n = len(layer)
    base = np.argsort(layer, kind="stable")  # heads grouped by layer
    order = np.argsort(layer[base][None, :] + rng.random((n_perm, n)), axis=1)  # random order inside each layer block
    perm = np.empty((n_perm, n), dtype=np.int64)
    perm[:, base] = base[order]
    return perm


def gqa_similarity(metrics: xr.Dataset, variable: str = "ap", n_perm: int = 2000, seed: int = 0,
                   device: str = "auto", chunk: int = 250) -> xr.Dataset:
    """Within- versus between-group similarity of plasticity profiles, with a within-layer permutation null.

    Parameters
    ----------
    metrics : xarray.Dataset
        :func:`qkplast.analyze` output (``variable`` with dims ``head, query_bucket``
        and the head coords ``layer``, ``kv_head``).
    n_perm : int
        Label permutations of the null (>= 1000 for a reported p-value).

    Returns
    -------
    xarray.Dataset
        ``statistic``, ``within``, ``between``, ``p_value`` (one-sided, groups
        more alike), ``null`` (dim ``permutation``), ``null_mean``, ``null_sd``,
        and per layer ``layer_statistic`` (dim ``layer_index``).
    """
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    dev = resolve_device(device)
    layer_np, kv_np = metrics["layer"].values, metrics["kv_head"].values
    groups = {int(layer): len(np.unique(kv_np[layer_np == layer])) for layer in np.unique(layer_np)}
    if not gqa_testable(metrics):
        raise ValueError("the captured heads hold no layer with two heads of one group and no layer with heads of two "
                         "groups: the GQA comparison needs both; capture more heads (--heads)")
    dist = profile_distances(as_f64(metrics[variable], dev))
    layer = torch.as_tensor(layer_np, device=dev)
    kv = torch.as_tensor(kv_np, device=dev)
    stat, within, between = (float(x[0]) for x in within_minus_between(dist, kv[None], layer))
    perms = within_layer_permutations(layer_np, n_perm, np.random.default_rng(seed))
    null = torch.cat([within_minus_between(dist, kv[torch.as_tensor(perms[s: s + chunk], device=dev)], layer)[0]
                      for s in range(0, n_perm, chunk)])
    null = to_numpy(null)
    layers = np.unique(layer_np)
    per_layer = []
    for ly in layers:  # a loop over layers for the descriptive breakdown only
        sel = layer_np == ly
        per_layer.append(float(within_minus_between(dist[sel][:, sel], kv[sel][None], layer[sel])[0][0])
                         if groups[int(ly)] >= 2 else np.nan)
    return xr.Dataset(
        {"statistic": stat, "within": within, "between": between,
         "p_value": (1 + np.sum(null <= stat)) / (1 + n_perm), "null": ("permutation", null),
         "null_mean": float(null.mean()), "null_sd": float(null.std(ddof=1)) if n_perm > 1 else np.nan,
         "layer_statistic": ("layer_index", np.asarray(per_layer))},
        coords={"layer_index": layers},
        attrs={"variable": variable, "n_perm": n_perm, "seed": seed,
               "method": "RMS profile distance; within-layer permutation of kv_head labels; one-sided p (groups more alike)"},
    )


def gqa_key_null(metrics: xr.Dataset, cross: xr.DataArray, n_perm: int = 2000, seed: int = 0) -> xr.Dataset:
    """The GQA statistic against a null that keeps every head's keys: queries exchanged within layers.

    Under the null, the query heads of a layer are exchangeable: any of them could be paired with any key
    head. A null draw permutes the query heads within every layer and gives head ``h`` the profile of
    query head ``pi(h)`` scored against ``h``'s own key head (:func:`cross_profiles`), so groups still share
    their keys; ``T`` (:func:`within_minus_between`, the original group labels) is computed on those
    profiles. The observed ``T`` is the identity permutation. One-sided p-value
    ``(1 + #{T_null <= T}) / (1 + n_perm)``: groups more alike than their shared keys make them.
    """
    if n_perm < 1:
        raise ValueError(f"n_perm must be >= 1, got {n_perm}")
    layer, kv = metrics["layer"].values, metrics["kv_head"].values
    prof = cross.values  # [head, slot, bucket]
    slot_kv = cross["kv_head_of_slot"].values
    rng = np.random.default_rng(seed)
    sums = np.zeros((n_perm + 1, 2))  # [draw, (within, between)] distance sums; draw 0 is the observed
    counts = np.zeros(2)
    for ly in np.unique(layer):  # per layer: the combos' distances once, then every permutation by gathering
        heads = np.flatnonzero(layer == ly)
        n = len(heads)
        own_slot = np.array([int(np.flatnonzero(slot_kv[h] == kv[h])[0]) for h in heads])  # [n]
        combos = torch.as_tensor(prof[heads].reshape(-1, prof.shape[-1]))  # [(query head, slot), bucket]
        dist = to_numpy(profile_distances(combos)).reshape(n, -1, n, prof.shape[1])  # [a, slot, b, slot]
        perms = np.concatenate([np.arange(n)[None], np.argsort(rng.random((n_perm, n)), axis=1)])  # [draw, n]
        d = dist[perms[:, :, None], own_slot[None, :, None], perms[:, None, :], own_slot[None, None, :]]  # [draw, n, n]
        same = kv[heads][:, None] == kv[heads][None, :]
        off = ~np.eye(n, dtype=bool)
        for c, mask in enumerate((same & off, ~same)):
            ok = mask[None] & np.isfinite(d)
            sums[:, c] += np.where(ok, d, 0.0).sum((1, 2))
            counts[c] += ok[0].sum()
    if not (counts > 0).all():
        raise ValueError("the captured heads hold no layer with two heads of one group and none with heads of two "
                         "groups: the GQA comparison needs both; capture more heads (--heads)")
    t = sums[:, 0] / counts[0] - sums[:, 1] / counts[1]  # [draw]
    stat, null = float(t[0]), t[1:]
    return xr.Dataset(
        {"statistic": stat, "p_value": (1 + np.sum(null <= stat)) / (1 + n_perm), "null": ("permutation", null),
         "null_mean": float(null.mean()), "null_sd": float(null.std(ddof=1)) if n_perm > 1 else np.nan},
        attrs={"n_perm": n_perm, "seed": seed,
               "method": "query heads permuted within layers, each head keeping its own key head; RMS profile distance; "
                         "one-sided p (groups more alike than shared keys make them)"})


def pairwise_predicts_listwise(metrics: xr.Dataset, set_size: int, variable: str = "ap_set", n_perm: int = 2000,
                               seed: int = 0) -> dict:
    """Rank correlation across heads of pairwise AP (m = 2) with listwise AP at ``set_size``, and the two-sided
    permutation p-value of no association (head labels of one side shuffled).

    Both are per-head means over the query buckets where the listwise value is defined (so the two average
    the same buckets). The interval of ``rho`` is over documents
    (:func:`qkplast.results.extra_metrics.listwise_document_intervals`), not over heads. Vectorised over permutations.
    """
    x, y = pairwise_and_listwise(metrics, set_size, variable)
    if len(x) < 3:
        raise ValueError(f"set size {set_size}: fewer than 3 heads with both pairwise and listwise values")
    rng = np.random.default_rng(seed)
    rx, ry = tied_ranks(x[None]), tied_ranks(y[None])  # [1, head] each, ranked once
    rho = float(rank_correlation(rx, ry)[0])
    perm = np.argsort(rng.random((n_perm, len(x))), axis=1)
    null = rank_correlation(np.broadcast_to(rx, perm.shape), ry[0][perm])  # a permuted side's ranks, permuted
    return {"set_size": set_size, "rho": rho, "p_perm": float((1 + np.sum(np.abs(null) >= abs(rho))) / (1 + n_perm)),
            "n_heads": int(len(x))}

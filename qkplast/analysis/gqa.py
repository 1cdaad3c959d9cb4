"""GQA groups: do query heads that share a key head have similar plasticity profiles (thesis 7.5)?

In a GQA layer, ``n_q / n_kv`` query heads read the same keys (eq. 4.1). The
thesis leaves open whether such a group is "coordinated or divergent". For
heads h, h' of one layer let ``D(h, h')`` be the root-mean-square difference of
their plasticity profiles over the query buckets where both are defined. The
statistic is

    T = mean_{same layer, same group} D  -  mean_{same layer, other group} D,

negative when a group's heads are more alike than heads of different groups.
This module computes it (:func:`profile_distances`, :func:`within_minus_between`, :func:`cross_profiles`); its
nulls and p-values (key-head labels permuted within layers; query heads exchanged with each keeping its keys) are
in :mod:`qkplast.stats.permutation_tests`.
"""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from qkplast.tensors import as_f64, resolve_device, to_numpy


def profile_distances(profiles: torch.Tensor) -> torch.Tensor:
    """RMS difference ``[head, head]`` of profiles ``[head, bucket]`` over buckets where both are defined (NaN: none)."""
    ok = ~torch.isnan(profiles)
    x = torch.nan_to_num(profiles)
    both = (ok[:, None] & ok[None]).to(profiles.dtype)  # [head, head, bucket]
    sq = ((x[:, None] - x[None]) ** 2 * both).sum(-1)
    n = both.sum(-1)
    return torch.where(n > 0, torch.sqrt(sq / n.clamp_min(1)), torch.full_like(sq, float("nan")))


def within_minus_between(dist: torch.Tensor, labels: torch.Tensor, layer: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``T``, the within-group and the between-group mean distances for label sets ``labels`` ``[perm, head]``."""
    n = dist.shape[0]
    same_layer = (layer[:, None] == layer[None]) & ~torch.eye(n, dtype=torch.bool, device=dist.device)
    ok = same_layer & ~torch.isnan(dist)
    d = torch.nan_to_num(dist)
    same = labels[:, :, None] == labels[:, None, :]  # [perm, head, head]
    w, b = (same & ok).to(d.dtype), (~same & ok).to(d.dtype)
    within = (w * d).sum((1, 2)) / w.sum((1, 2))
    between = (b * d).sum((1, 2)) / b.sum((1, 2))
    return within - between, within, between


def gqa_testable(metrics: xr.Dataset) -> bool:
    """Whether the captured heads give both kinds of same-layer pairs: two heads of one group, and two of different groups."""
    layer, kv = metrics["layer"].values, metrics["kv_head"].values
    within = between = 0
    for ly in np.unique(layer):
        _, n = np.unique(kv[layer == ly], return_counts=True)
        within += int((n * (n - 1) // 2).sum())
        between += int((n.sum() ** 2 - (n * n).sum()) // 2)
    return within > 0 and between > 0


# --------------------------------------------------------------------------- a null that keeps the keys


def cross_profiles(capture: xr.Dataset, options=None, **overrides) -> xr.DataArray:
    """Closed-form plasticity profile of every captured query head against every key head of its layer.

    Heads of one GQA group share their keys, so their profiles are partly alike whatever their queries do.
    ``cross[h, j]`` is the profile (eqs. 4.10-4.14, the analysis's options and key pairs) of query head
    ``h``'s queries scored against the keys of the ``j``-th key head of ``h``'s layer (``kv_head`` order;
    NaN where the layer has fewer). ``cross[h, slot of kv_head(h)]`` is head ``h``'s own ``ap``.

    Returns
    -------
    xarray.DataArray ``[head, kv_slot, query_bucket]`` with coord ``kv_head_of_slot`` ``[head, kv_slot]``.
    """
    from qkplast.tensors import head_vectors  # noqa: F401  (the same float64 conversion as the analysis)
    from qkplast.analysis.pairs import pair_plan
    from qkplast.analysis.plasticity import closed_form, weighted_pair_mean
    from qkplast.options import AnalysisOptions

    opt = AnalysisOptions.from_kwargs(options, **overrides)
    dev = resolve_device(opt.device)
    lay = pair_plan(capture, opt, dev, warn=False)
    layer, kv = capture["layer"].values, capture["kv_head"].values
    n_slot = max(len(np.unique(kv[layer == ly])) for ly in np.unique(layer))
    out = np.full((capture.sizes["head"], n_slot, len(lay.buckets)), np.nan)
    slot_kv = np.full((capture.sizes["head"], n_slot), -1, dtype=np.int64)
    q_all, k_all = capture["q"].values, capture["k"].values
    for ly in np.unique(layer):  # a loop over layers: every (query head, key head) pair of a layer at once
        heads = np.flatnonzero(layer == ly)
        groups = np.unique(kv[heads])
        rep = {g: heads[kv[heads] == g][0] for g in groups}  # a captured head of each key head holds its keys
        # a head's own key head from its own keys (in a capture every head of a group has the same ones)
        pairs = [(h, j, h if g == kv[h] else rep[g]) for h in heads for j, g in enumerate(groups)]
        q = as_f64(q_all[[h for h, _, _ in pairs]], dev)  # [pair, sample, dim]
        k = as_f64(k_all[[r for _, _, r in pairs]], dev)
        pp = closed_form(q, k, lay.t, lay.onehot, lay.tau, lay.pi, lay.pj, opt)[3]
        prof = to_numpy(weighted_pair_mean(pp, lay.pweight))  # [pair, bucket]
        for (h, j, _), row in zip(pairs, prof):
            out[h, j] = row
        slot_kv[heads, :len(groups)] = groups
    return xr.DataArray(out, dims=("head", "kv_slot", "query_bucket"),
                        coords={"query_bucket": lay.buckets, "kv_head_of_slot": (("head", "kv_slot"), slot_kv)})

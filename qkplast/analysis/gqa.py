"""GQA groups: do query heads that share a key head have similar plasticity profiles (thesis 7.5)?

In a GQA layer, ``n_q / n_kv`` query heads read the same keys (eq. 4.1). The
thesis leaves open whether such a group is "coordinated or divergent". For
heads h, h' of one layer let ``D(h, h')`` be the root-mean-square difference of
their plasticity profiles over the query buckets where both are defined. The
statistic is

    T = mean_{same layer, same group} D  -  mean_{same layer, other group} D,

negative when a group's heads are more alike than heads of different groups.
The null distribution permutes the key-head labels among the query heads of
each layer (group sizes kept, layers never mixed), so it holds the layer fixed
and asks only whether the grouping matters; the one-sided p-value is
``(1 + #{T_perm <= T}) / (1 + n_perm)``.
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


def within_layer_permutations(layer: np.ndarray, n_perm: int, rng: np.random.Generator) -> np.ndarray:
    """``[perm, head]`` indices: each row permutes the heads within every layer."""
    n = len(layer)
    base = np.argsort(layer, kind="stable")  # heads grouped by layer
    order = np.argsort(layer[base][None, :] + rng.random((n_perm, n)), axis=1)  # random order inside each layer block
    perm = np.empty((n_perm, n), dtype=np.int64)
    perm[:, base] = base[order]
    return perm


def gqa_testable(metrics: xr.Dataset) -> bool:
    """Whether the captured heads give both kinds of same-layer pairs: two heads of one group, and two of different groups."""
    layer, kv = metrics["layer"].values, metrics["kv_head"].values
    within = between = 0
    for ly in np.unique(layer):
        _, n = np.unique(kv[layer == ly], return_counts=True)
        within += int((n * (n - 1) // 2).sum())
        between += int((n.sum() ** 2 - (n * n).sum()) // 2)
    return within > 0 and between > 0


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

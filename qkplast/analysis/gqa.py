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

from qkplast._torch import as_f64, resolve_device, to_numpy


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

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
    """``T``, the within-group and the between-group mean distances for label sets ``labels`` ``[perm, head]``.

    Only pairs of distinct heads of one layer with a distance count. The within-group sum of a label set is
    ``sum_g (L^T D L)_gg`` with ``L`` ``[head, group]`` its one-hot labels and ``D`` the counted distances, one
    product ``[perm, group, head] x [head, head]`` for every label set at once (the ``[perm, head, head]`` masks
    of a direct sum are never formed); the between-group sum is the rest of the total, and the counts likewise.
    """
    n = dist.shape[0]
    same_layer = (layer[:, None] == layer[None]) & ~torch.eye(n, dtype=torch.bool, device=dist.device)
    ok = same_layer & ~torch.isnan(dist)
    d = torch.where(ok, dist, torch.zeros_like(dist))  # [head, head] the counted distances
    _, code = torch.unique(labels, return_inverse=True)  # [perm, head] group index of each label
    onehot = torch.nn.functional.one_hot(code, int(code.max()) + 1).to(dist.dtype).transpose(1, 2)  # [perm, group, head]
    sums = torch.stack([((onehot @ x) * onehot).sum((1, 2)) for x in (d, ok.to(dist.dtype))])  # [2, perm]
    within = sums[0] / sums[1]
    between = (d.sum() - sums[0]) / (ok.sum().to(dist.dtype) - sums[1])
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


def cross_profiles_of_cuts(capture: xr.Dataset, cuts, options=None, pairs=None, **overrides) -> xr.DataArray:
    """:func:`cross_profiles` of many cuts of one capture at once: ``[cut, head, kv_slot, query_bucket]``.

    Parameters
    ----------
    cuts : sequence of boolean masks ``[sample]`` or of sample indices
        Cut ``c`` is analysed as ``cross_profiles(capture.isel(sample=np.flatnonzero(cuts[c])))`` would analyse it:
        its own key pairs, drawn on the cut (or ``pairs[c]``), its own Householder basis and query model per query
        head.

    Batched over a leading axis twice (:mod:`qkplast.analysis.cuts`): each (cut, query head) is one unit of the
    queries' basis and model, and each (cut, head holding a key head's keys) one group whose pair differences every
    query head of the layer is scored against at once (:func:`qkplast.analysis.cuts.shared_key_profiles`). A head's
    own slot uses its own keys, as :func:`cross_profiles` does; the heads of a group share one set of keys in a
    capture, and where their keys are bit for bit the representative's they share its group. Options the batched
    kernels do not reproduce (:func:`qkplast.analysis.cuts.supports`) are analysed cut by cut.
    """
    from qkplast.analysis.cuts import (cut_plan, gather_rows, keeps_of, map_units, padded_source, rotated_models,
                                       shared_key_profiles, supports, unit_clouds)
    from qkplast.options import AnalysisOptions
    from qkplast.tensors import SCRATCH_CPU_MB, auto_chunk

    opt = AnalysisOptions.from_kwargs(options, **overrides)
    keeps = keeps_of(capture, cuts)
    n_cut, n_head = keeps.shape[0], capture.sizes["head"]
    layer, kv = capture["layer"].values, capture["kv_head"].values
    n_slot = max(len(np.unique(kv[layer == ly])) for ly in np.unique(layer))
    slot_kv = np.full((n_head, n_slot), -1, dtype=np.int64)
    k_all = capture["k"].values
    groups = []  # (head whose keys are read, slot, [query heads scored against them]), as cross_profiles pairs them
    for ly in np.unique(layer):
        heads = np.flatnonzero(layer == ly)
        for j, g in enumerate(np.unique(kv[heads])):
            rep = heads[kv[heads] == g][0]  # a captured head of the key head holds its keys
            own = [h for h in heads[kv[heads] == g] if h != rep and not np.array_equal(k_all[h], k_all[rep])]
            groups.append((rep, j, [h for h in heads if h not in own]))
            groups += [(h, j, [h]) for h in own]  # a head whose keys differ from its group's reads its own
        slot_kv[heads, :len(np.unique(kv[heads]))] = np.unique(kv[heads])
    coords = {"kv_head_of_slot": (("head", "kv_slot"), slot_kv)}
    pairs = [None] * n_cut if pairs is None else list(pairs)
    if not supports(opt):
        out = np.stack([cross_profiles(capture.isel(sample=np.flatnonzero(keep)), opt).values for keep in keeps])
        return xr.DataArray(out, dims=("cut", "head", "kv_slot", "query_bucket"),
                            coords={"query_bucket": np.arange(out.shape[-1]), **coords})
    dev = resolve_device(opt.device)
    plan = cut_plan(capture, keeps, opt, dev, pairs)
    if not len(plan.pair_buckets):  # no bucket of any cut has a weighted pair: every profile is NaN
        return xr.DataArray(np.full((n_cut, n_head, n_slot, plan.n_bucket), np.nan), dims=("cut", "head", "kv_slot",
                            "query_bucket"), coords={"query_bucket": np.arange(plan.n_bucket), **coords})
    q, k = (padded_source(capture[name].values, dev) for name in ("q", "k"))  # [head, sample + 1, dim]
    per_unit = 8 * plan.samples.shape[1] * capture.sizes["dim"] * 5  # the queries' float64 copies

    def query_chunk(sl: slice) -> tuple:  # the basis and model of query units (cut, head)
        unit = torch.arange(sl.start, sl.stop, device=dev)
        cut = unit // n_head
        clouds = unit_clouds(gather_rows(q, plan, cut, unit % n_head, "cut_q"), None, plan, cut, centred_keys=False)
        return rotated_models(clouds, plan)

    parts = map_units(query_chunk, n_cut * n_head, opt.head_chunk or auto_chunk(per_unit, dev, SCRATCH_CPU_MB), dev)
    models = tuple(torch.cat(x) for x in zip(*parts))  # rows: unit = cut * n_head + head
    n_member = max(len(m) for _, _, m in groups)
    key_head = torch.as_tensor([r for r, _, _ in groups], device=dev)
    member_head = np.zeros((len(groups), n_member), dtype=np.int64)
    present = np.zeros((len(groups), n_member), dtype=bool)
    for i, (_, _, m) in enumerate(groups):
        member_head[i, :len(m)], present[i, :len(m)] = m, True
    member_head, present = torch.as_tensor(member_head, device=dev), torch.as_tensor(present, device=dev)

    def group_chunk(sl: slice) -> torch.Tensor:  # groups (cut, key source) in cut-major order
        index = torch.arange(sl.start, sl.stop, device=dev)
        cut, g = index // len(groups), index % len(groups)
        return shared_key_profiles(k, plan, cut, key_head[g], models, cut[:, None] * n_head + member_head[g],
                                   present[g])  # [group, pair_bucket, member]

    per_group = 8 * plan.pi[0].numel() * (capture.sizes["dim"] * 2 + 8 * n_member)
    prof = to_numpy(torch.cat(map_units(group_chunk, n_cut * len(groups),
                                        auto_chunk(per_group, dev, SCRATCH_CPU_MB), dev)))
    prof = prof.reshape(n_cut, len(groups), len(plan.pair_buckets), n_member)
    out = np.full((n_cut, n_head, n_slot, plan.n_bucket), np.nan)
    for i, (_, j, m) in enumerate(groups):  # buckets without a weighted pair stay NaN
        out[:, np.asarray(m)[:, None], j, plan.pair_buckets[None, :]] = np.moveaxis(prof[:, i, :, :len(m)], -1, 1)
    return xr.DataArray(out, dims=("cut", "head", "kv_slot", "query_bucket"),
                        coords={"query_bucket": np.arange(plan.n_bucket), **coords})

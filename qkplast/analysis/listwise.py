"""Listwise plasticity: does the query decide which key of a set wins (beyond the thesis, 7.5)?

Pairwise plasticity (Definition 4.2) asks whether the query decides the order
of two keys. Softmax weighs all keys at once, so the defence's first question
is whether a head that looks plastic pairwise is also plastic for a set. For a
set S of m keys let ``P_i`` be the probability, over the bucket's queries, that
key i has the highest score ``q^T k_i``. The listwise plasticity of the set is
the normalised Gini-Simpson index of the winner distribution,

    AP_set(S) = (1 - sum_i P_i^2) / (1 - 1/m),

which is 1 when every key wins equally often (the query alone decides), 0 when
one key always wins (the winner is fixed), and for m = 2 equals
``(1 - p^2 - (1-p)^2) / (1/2) = 4 p (1 - p)``, the pairwise plasticity.

Estimates, on the same sets, per head and query bucket:

* ``ap_set_mc`` from the bucket's captured queries, with the unbiased factor
  ``n / (n - 1)`` on ``1 - sum P_i^2`` (at m = 2 this is ``ap_mc`` exactly);
* ``ap_set`` from the fitted Gaussian query model (eqs. 4.11-4.12): at m = 2 the
  closed form (eq. 4.14, so it is ``ap`` exactly); for m > 2 the winner
  probabilities of m correlated Gaussian scores have no closed form (orthant
  probabilities), so they are estimated from ``n_model_queries`` queries drawn
  from the fitted model (common random numbers across heads and buckets).

Sets follow the pairwise estimator's rules (``eligible_keys``, ``pair_docs``):
m distinct eligible keys of one document, the document drawn with probability
proportional to its number of m-subsets; m = 2 uses the pairwise estimator's own
pairs; set size 0 means the document's whole eligible set.
"""

from __future__ import annotations

import functools

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr
from scipy.special import gammaln

from qkplast.tensors import (LISTWISE_CPU_MB, auto_chunk, head_vectors, map_head_chunks, matmul, resolve_device,
                            scratch, to_numpy)
from qkplast.analysis.moments import cloud_moments
from qkplast.analysis.pairs import PlasticityWarning, pair_plan
from qkplast.analysis.plasticity import (QueryModel, Rotated, bytes_per_head, pair_kernel, rotated_clouds,
                                         weighted_pair_mean)
from qkplast.analysis.certified_signs import float32_products_are_exact_ieee, sign_bound
from qkplast.analysis.compiled import set_winner_counts, win_count_gini
from qkplast.analysis.vectors import analysis_vectors
from qkplast.options import AnalysisOptions

WHOLE = 0  # set size code of "the document's whole eligible set"


# --------------------------------------------------------------------------- sets


def eligible_samples(capture: xr.Dataset, tau: np.ndarray, opt: AnalysisOptions, qb: int) -> np.ndarray:
    """Sample indices of the keys eligible for query bucket ``qb`` (``options.eligible_keys``)."""
    if opt.eligible_keys == "earlier_buckets":
        return np.flatnonzero(capture["bucket"].values < qb)
    return np.flatnonzero(capture["position"].values < tau[qb]) if np.isfinite(tau[qb]) else np.array([], dtype=np.int64)


def document_codes(capture: xr.Dataset, opt: AnalysisOptions | None = None) -> np.ndarray:
    """Document index of each sample (``np.unique`` order); all 0 with ``pair_docs="any"``."""
    if opt is not None and opt.pair_docs == "any":
        return np.zeros(capture.sizes["sample"], dtype=np.int64)
    return np.unique(capture["doc"].values, return_inverse=True)[1]


def draw_sets(capture: xr.Dataset, lay, opt: AnalysisOptions, size: int, n_sets: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Key sets per query bucket: sample indices ``[bucket, set, slot]`` and a mask of used slots.

    ``lay`` is the plasticity layout (:func:`qkplast.analysis.pairs.pair_plan`).
    ``size == 2`` returns the pairwise estimator's pairs; ``size == 0`` one set per
    document, its whole eligible set (padded); otherwise ``n_sets`` sets of
    ``size`` distinct keys drawn as the module docstring says. A bucket without
    an admissible set has an all-False mask.
    """
    n_bucket = len(lay.buckets)
    if size == 2:
        idx = np.stack([lay.pairs.i, lay.pairs.j], -1)  # [bucket, pair, 2]
        return idx, np.repeat(lay.pairs.valid[..., None], 2, -1)
    code = document_codes(capture, opt)
    per_bucket = []
    for qb in range(n_bucket):  # a loop over buckets only; sets are drawn vectorised
        elig = eligible_samples(capture, lay.pairs.tau, opt, qb)
        order = elig[np.argsort(code[elig], kind="stable")]
        _, start, count = np.unique(code[order], return_index=True, return_counts=True)
        per_bucket.append((order, start, count))
    if size == WHOLE:
        width = max([int(c.max()) for _, _, c in per_bucket if len(c)] + [1])
        n_docs = max([len(c) for _, _, c in per_bucket] + [1])
        idx = np.zeros((n_bucket, n_docs, width), dtype=np.int64)
        mask = np.zeros((n_bucket, n_docs, width), dtype=bool)
        for qb, (order, start, count) in enumerate(per_bucket):
            for d, (s, c) in enumerate(zip(start, count)):
                if c >= 2:
                    idx[qb, d, :c], mask[qb, d, :c] = order[s: s + c], True
        return idx, mask
    idx = np.zeros((n_bucket, n_sets, size), dtype=np.int64)
    mask = np.zeros((n_bucket, n_sets, size), dtype=bool)
    for qb, (order, start, count) in enumerate(per_bucket):
        ok = count >= size
        if not ok.any():
            continue
        # log C(c, m): documents weighted by their number of admissible m-subsets
        logw = np.where(ok, gammaln(count + 1) - gammaln(size + 1) - gammaln(np.maximum(count - size, 0) + 1), -np.inf)
        w = np.exp(logw - logw.max())
        d = rng.choice(len(count), size=n_sets, p=w / w.sum())
        u = rng.random((n_sets, int(count.max())))
        u[np.arange(u.shape[1])[None, :] >= count[d][:, None]] = np.inf  # slots beyond the document's keys
        pick = np.argsort(u, axis=1)[:, :size]  # m distinct keys of the document, uniformly
        idx[qb], mask[qb] = order[start[d][:, None] + pick], True
    return idx, mask


# --------------------------------------------------------------------------- kernels


def winner_plasticity(scores: torch.Tensor, smask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Listwise plasticity ``[head, set]`` of each set from query scores.

    Parameters
    ----------
    scores : Tensor ``[head, query, set, slot]``
        ``q^T k`` of each query with each key of each set; unused slots hold ``-inf``.
    smask : Tensor ``[set, slot]``
        Used slots; a set with fewer than two keys gives NaN.
    unbiased : bool
        Multiply ``1 - sum P_i^2`` by ``n / (n - 1)`` (unbiased for ``n`` i.i.d. queries).

    Notes
    -----
    Tied maxima split the win equally, so at m = 2 ties count one half as in
    the pairwise Monte Carlo estimate. Without ties (the usual case) the win
    counts come from a scatter of the argmax, four passes over ``scores``.
    """
    h, n, n_set, n_slot = scores.shape
    top, arg = scores.max(-1)  # [head, query, set]
    n_top = (scores == top[..., None]).sum(-1)  # [head, query, set]
    if bool((n_top > 1).any()):
        win = (scores == top[..., None]).to(scores.dtype) / n_top[..., None].to(scores.dtype)
        p = win.sum(1) / n  # [head, set, slot]
    else:
        counts = torch.zeros(h, n_set, n_slot, dtype=scores.dtype, device=scores.device)
        counts.scatter_add_(2, arg.transpose(1, 2), torch.ones(h, n_set, n, dtype=scores.dtype, device=scores.device))
        p = counts / n
    gini = 1 - (p * p).sum(-1)  # [head, set]
    if unbiased:
        gini = gini * n / max(n - 1, 1)
    m = smask.sum(-1).to(scores.dtype)  # [set]
    ap = gini / (1 - 1 / m.clamp_min(2))
    bad = (m < 2)[None] | (n < 2)
    return torch.where(bad, torch.full_like(ap, float("nan")), ap)


def model_draws(model: QueryModel, z: torch.Tensor, bucket: int) -> torch.Tensor:
    """Queries ``[head, draw, dim]`` of the fitted Gaussian model of one bucket from standard normals ``z`` ``[draw, dim]``."""
    mean = model.mean[:, bucket]  # [head, dim]
    if model.full:
        val, vec = torch.linalg.eigh(model.cov[:, bucket])  # [head, dim], [head, dim, dim]
        root = vec * val.clamp_min(0).sqrt()[:, None, :]  # cov = root root^T
        return mean[:, None] + torch.einsum("nd,hed->hne", z, root)
    return mean[:, None] + z[None] * model.cov[:, bucket].clamp_min(0).sqrt()[:, None]


def gather_sets(all_scores: torch.Tensor, idx: torch.Tensor, smask: torch.Tensor) -> torch.Tensor:
    """Scores ``[head, query, set, slot]`` from scores against every candidate key ``[head, query, key]``; unused slots ``-inf``.

    ``idx`` ``[set, slot]`` indexes the candidate keys (the last axis of ``all_scores``). One
    ``index_select`` along the keys; the ``-inf`` column is appended only when some slot is unused.
    """
    if bool(smask.all()):
        return torch.index_select(all_scores, -1, idx.reshape(-1)).view(*all_scores.shape[:-1], *idx.shape)
    pad = torch.full(all_scores.shape[:-1] + (1,), -torch.inf, dtype=all_scores.dtype, device=all_scores.device)
    padded = torch.cat([all_scores, pad], -1)  # [head, query, key + 1]
    flat = torch.where(smask, idx, all_scores.shape[-1]).reshape(-1)
    return torch.index_select(padded, -1, flat).view(*all_scores.shape[:-1], *idx.shape)


@dataclass
class BucketSets:
    """What every head shares in one query bucket: its queries, its eligible keys, and indices into those keys."""

    queries: torch.Tensor  # [query] sample indices
    keys: torch.Tensor  # [key] eligible sample indices, in position order: the first ones of SetPlan.key_order
    sets: list  # per set size (not 2): (idx [set, slot] into keys, mask [set, slot])
    nearest: torch.Tensor  # [key] keys in the nearest eligible bucket
    has: torch.Tensor  # [query] the query's document has keys in the nearest bucket
    query_doc: torch.Tensor  # [query] document index of each query
    key_group: torch.Tensor  # [group, key] keys of each pairing group (documents; one group with pair_docs="any")
    query_group: torch.Tensor  # [query] pairing group of each query


@dataclass
class SetPlan:
    """The sets, queries and model draws of :func:`listwise`, shared by every head (one per capture)."""

    sizes: list  # set sizes, 2 included
    n_sets: np.ndarray  # [bucket, size] sets with two keys or more
    buckets: list  # BucketSets or None (no statistics or no keys) per bucket
    z: torch.Tensor  # [draw, dim] standard normals of the model draws, common to heads and buckets
    share: np.ndarray  # [bucket] equal-score mass on the nearest bucket
    share_doc: np.ndarray  # [bucket, doc]
    n_doc: int
    key_order: torch.Tensor  # [sample] samples by position: every bucket's eligible keys are a prefix of it


def set_plan(capture: xr.Dataset, lay, opt: AnalysisOptions, dev: torch.device, warn: bool = True) -> SetPlan:
    """Draw the key sets of every size and bucket and index them into each bucket's eligible keys."""
    rng = np.random.default_rng(opt.seed)
    sizes = list(opt.set_sizes)
    drawn = {m: draw_sets(capture, lay, opt, m, opt.n_sets, rng) for m in sizes}
    if warn:
        for m, (_, mask) in drawn.items():
            if not mask.any():
                warnings.warn(f"set size {m}: no query bucket has a document with {m} eligible keys "
                              f"(pair_docs={opt.pair_docs!r}); ap_set is NaN there", PlasticityWarning, stacklevel=3)
    usable = (lay.counts >= opt.min_bucket_samples) & (lay.counts > 0)
    code = document_codes(capture, opt)
    doc_of = document_codes(capture)  # the true documents, for the per-document nearest mass
    n_doc = int(doc_of.max()) + 1
    sample_bucket = capture["bucket"].values
    n_bucket = len(lay.buckets)
    share, share_doc = np.full(n_bucket, np.nan), np.full((n_bucket, n_doc), np.nan)
    # both eligibility rules take the keys before a position (bucket = position // bucket size), so in position
    # order a bucket's eligible keys come first: each bucket's keys are then a view of one sorted copy per chunk
    key_order = np.argsort(capture["position"].values, kind="stable")  # [sample]
    out = []
    for b in range(n_bucket):  # buckets only
        keys = eligible_samples(capture, lay.pairs.tau, opt, b)
        if not np.array_equal(np.sort(key_order[: keys.size]), keys):  # the capture format's bucket rule broken
            raise ValueError(f"query bucket {b}: its eligible keys are not the samples before a position; a capture's "
                             "buckets must be position // bucket_size (validate it with qkplast.validate_capture)")
        keys = key_order[: keys.size]  # the same keys, in position order
        qs = np.flatnonzero(sample_bucket == b)
        if keys.size == 0 or qs.size == 0 or not usable[b]:
            out.append(None)
            continue
        local = np.full(capture.sizes["sample"], -1, dtype=np.int64)
        local[keys] = np.arange(keys.size)
        sets = []
        for m in sizes:
            if m == 2:
                continue
            idx, mask = drawn[m]
            keep = mask[b].sum(-1) >= 2  # sets with at least two keys
            # slots no set of this bucket uses go (the slot axis is padded to the largest bucket's): they can
            # never win, and the whole-set size 0 would otherwise carry every bucket at the last one's key count
            used = mask[b][keep][:, : int(np.flatnonzero(mask[b][keep].any(0)).max(initial=-1)) + 1]  # [set, slot]
            slots = idx[b][keep][:, : used.shape[1]]  # [set, slot]
            sets.append((torch.as_tensor(np.where(used, local[slots], 0), device=dev), torch.as_tensor(used, device=dev)))
        nearest = sample_bucket[keys] == sample_bucket[keys].max()
        same = code[qs][:, None] == code[keys][None, :]
        has = (same & nearest[None]).any(1)
        sh = (same & nearest[None]).sum(1) / np.maximum(same.sum(1), 1)
        if has.any():
            share[b] = sh[has].mean()
            for d in np.unique(doc_of[qs][has]):
                share_doc[b, d] = sh[has & (doc_of[qs] == d)].mean()
        groups, query_group = np.unique(code[qs], return_inverse=True)
        key_group = code[keys][None, :] == groups[:, None]  # [group, key]
        out.append(BucketSets(*(torch.as_tensor(x, device=dev) for x in (qs, keys)), sets,
                              *(torch.as_tensor(x, device=dev) for x in (nearest, has, doc_of[qs], key_group,
                                                                          query_group))))
    n_sets = np.stack([(drawn[m][1].sum(-1) >= 2).sum(-1) for m in sizes], -1) * usable[:, None]  # [bucket, size]
    gen = torch.Generator().manual_seed(opt.seed)
    z = torch.randn(opt.n_model_queries, capture.sizes["dim"], generator=gen, dtype=torch.float64).to(dev)
    return SetPlan(sizes, n_sets.astype(np.int64), out, z, share, share_doc, n_doc, torch.as_tensor(key_order, device=dev))


@dataclass
class ListwiseChunk:
    """What :func:`listwise_kernel` returns for a chunk of heads."""

    ap_set: torch.Tensor  # [head, bucket, size] (size 2 left NaN: it is the pairwise ap)
    ap_set_mc: torch.Tensor
    near_pos: torch.Tensor  # [head, bucket]
    near_act: torch.Tensor
    near_pos_doc: torch.Tensor  # [head, bucket, doc]
    near_act_doc: torch.Tensor


def _doc_means(x: torch.Tensor, ok: torch.Tensor, doc: torch.Tensor, n_doc: int) -> torch.Tensor:
    """Means of ``x`` ``[head, query]`` over the queries of each document where ``ok`` ``[query]``: ``[head, doc]``."""
    onehot = ((doc[:, None] == torch.arange(n_doc, device=x.device)[None]) & ok[:, None]).to(x.dtype)  # [query, doc]
    n = onehot.sum(0)
    return torch.where(n > 0, (x @ onehot) / n.clamp_min(1), torch.full_like(n, float("nan")).expand(x.shape[0], -1))


def certified_winner_plasticity(scores32: torch.Tensor, bound: torch.Tensor, idx: torch.Tensor, smask: torch.Tensor,
                                exact, n_head: int, unbiased: bool | tuple[bool, ...],
                                rows: tuple[int, ...] | None = None) -> torch.Tensor:
    """:func:`winner_plasticity` of each set from float32 scores whose winners a rounding bound certifies.

    Parameters
    ----------
    scores32 : Tensor ``[key, head * row]``
        float32 scores of the bucket's query rows against its candidate keys, keys first (a set's scores are
        then whole rows, gathered as contiguous copies).
    bound : Tensor ``[head * row]``
        Each float32 score of that row is within ``bound`` of the exact one
        (:func:`qkplast.analysis.certified_signs.sign_bound` times ``||q|| max ||k||``).
    idx, smask : Tensor ``[set, slot]``
        The sets, as indices into the candidate keys, and their used slots.
    exact : callable
        ``exact(head, row, keys)`` the float64 scores ``[n, slot]`` of the given rows (``keys`` ``[n, slot]``).
    unbiased : bool or tuple of bool
        Multiply ``1 - sum P_i^2`` by ``n / (n - 1)``; one flag per source with ``rows``.
    rows : tuple of int, optional
        The rows of each head come from ``len(rows)`` sources in turn, ``rows[s]`` rows of source ``s`` (the
        captured queries, then the model draws: one product and one pass over the sets serve both); each
        source has its own winner distribution. Default: one source.

    Returns
    -------
    Tensor ``[head, set]`` (``[source, head, set]`` with ``rows``): the values :func:`winner_plasticity` gives
    on the float64 scores of each source's rows. A winner is certain when no other key of its set scores
    within ``2 bound`` of it in float32; the other rows (near-ties) are scored again in float64, and tied
    maxima there split the win as in :func:`winner_plasticity`.
    """
    n_set, n_slot = idx.shape
    n_col = scores32.shape[1]
    sizes = (n_col // n_head,) if rows is None else tuple(rows)
    flags = (unbiased,) if rows is None else tuple(unbiased)
    group = column_groups(n_head, sizes, scores32.device)  # [head * row]: head * n_source + source
    counts, unsure, threshold = certain_wins(scores32, bound, idx, smask, group, n_head * len(sizes))
    if bool(unsure.any()):
        ss, col = unsure.nonzero(as_tuple=True)  # the uncertain (set, column) cells
        # only the close keys can win: any other scores below the float32 top key's exact score (float32 score
        # below top - 2 bound, so exact below top - bound), so only they are scored again in float64
        close = (scores32[idx[ss], col[:, None]] >= threshold[ss, col][:, None]) & smask[ss]  # [n_unsure, slot]
        u, slot = close.nonzero(as_tuple=True)  # [n_close]
        e = torch.full((ss.numel(), n_slot), -torch.inf, dtype=torch.float64, device=scores32.device)  # [n_unsure, slot]
        e[u, slot] = exact(col[u] // sum(sizes), col[u] % sum(sizes), idx[ss[u], slot][:, None])[:, 0]
        tie = (e == e.amax(-1, keepdim=True)).to(torch.float64)
        counts.index_put_((ss[:, None].expand_as(tie), torch.arange(n_slot, device=e.device)[None].expand_as(tie),
                           group[col][:, None].expand_as(tie)),
                          tie / tie.sum(-1, keepdim=True), accumulate=True)
    ap = gini_plasticity(counts.view(n_set, n_slot, n_head, len(sizes)), sizes, flags, smask)  # [source, head, set]
    return ap[0] if rows is None else ap


def certain_wins(scores32: torch.Tensor, bound: torch.Tensor, idx: torch.Tensor, smask: torch.Tensor,
                 group: torch.Tensor, n_group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The wins that float32 scores certify: counts ``[set, slot, group]`` (float64), the uncertain cells
    ``[set, column]`` and the close threshold ``[set, column]`` of :func:`certified_winner_plasticity`.

    A cell ``(set, column)`` whose set has one close key (float32 score at least :func:`close_threshold` of the
    set's top score) has that key as its certain winner, counted once in the column's ``group``. On the CPU
    one compiled pass per set (:func:`qkplast.analysis.compiled.set_winner_counts`) reads the set's rows where
    they lie, twice while they are in cache (no gathered copy, no comparison written out); elsewhere
    :func:`certain_wins_torch`. The two give the same tensors.
    """
    if scores32.device.type != "cpu":
        return certain_wins_torch(scores32, bound, idx, smask, group, n_group)
    return set_winner_counts(scores32, idx, smask, twice_bound32(bound), group, n_group)


def certain_wins_torch(scores32: torch.Tensor, bound: torch.Tensor, idx: torch.Tensor, smask: torch.Tensor,
                       group: torch.Tensor, n_group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`certain_wins` in torch operations (any device): the sets' rows gathered, their top, the close keys
    written out as float32 and counted by one product."""
    n_set, n_slot = idx.shape
    g = set_scores(scores32, idx, smask).view(n_set, n_slot, -1)  # [set, slot, column]
    threshold = close_threshold(g.amax(1), bound)  # [set, column]
    # the comparison writes float32 itself: converting a bool result afterwards is one more pass over the scores
    close = torch.ge(g, threshold[:, None], out=scratch("listwise_close", g.shape, g))  # [set, slot, column]
    # one product gives both the number of close keys and, where it is one, the winner's slot (a reduction
    # over the slots as a product, faster than max with indices over a middle axis)
    count_arg = torch.matmul(slot_weights(n_slot, g.device), close)  # [set, 2, column]
    sure = count_arg[:, 0] == 1  # [set, column]
    arg = count_arg[:, 1].round_().long().masked_fill_(~sure, 0)  # an uncertain cell is counted by the caller
    counts = torch.zeros(n_set, n_slot, n_group, dtype=torch.float64, device=g.device)
    counts.view(n_set, -1).scatter_add_(1, arg * n_group + group, sure.to(torch.float64))
    return counts, ~sure, threshold


def gini_plasticity(counts: torch.Tensor, n: tuple[int, ...], unbiased: tuple[bool, ...],
                    smask: torch.Tensor) -> torch.Tensor:
    """Listwise plasticity ``[source, head, set]`` from the win counts ``[set, slot, head, source]`` of ``n[s]``
    rows per head of source ``s`` (``unbiased[s]``: times ``n / (n - 1)``)."""
    n_rows = torch.tensor(n, dtype=torch.float64, device=counts.device)  # [source]
    num, den = (torch.tensor([(r, max(r - 1, 1)) if flag else (1, 1) for r, flag in zip(n, unbiased)],
                             dtype=torch.float64, device=counts.device).T)  # [source] each
    m = smask.sum(-1).to(torch.float64)  # [set]
    if counts.device.type == "cpu":  # the same operations in one compiled loop (a dozen small tensors here)
        return win_count_gini(counts, n_rows, num, den, m).transpose(1, 2)
    return gini_plasticity_torch(counts, n_rows, num, den, m)


def gini_plasticity_torch(counts: torch.Tensor, n_rows: torch.Tensor, num: torch.Tensor, den: torch.Tensor,
                          m: torch.Tensor) -> torch.Tensor:
    """:func:`gini_plasticity` in torch operations (any device), from the rows per source ``n_rows``, the unbiased
    factor ``num / den`` ``[source]`` and the keys per set ``m`` ``[set]``."""
    p = counts / n_rows  # [set, slot, head, source]
    gini = (1 - (p * p).sum(1)) * num / den  # [set, head, source]
    m = m[:, None, None]  # [set, 1, 1]
    ap = gini / (1 - 1 / m.clamp_min(2))  # [set, head, source]
    ap = torch.where((m < 2) | (n_rows < 2), torch.full_like(ap, float("nan")), ap)
    # sources first, then sets last as a view of a sets-first array: the layout (and so the order of the
    # callers' means over the sets) of one source's result
    return ap.permute(2, 0, 1).contiguous().transpose(1, 2)


def set_scores(scores32: torch.Tensor, idx: torch.Tensor, smask: torch.Tensor) -> torch.Tensor:
    """The scores of each set's slots, ``[set * slot, column]`` from ``scores32`` ``[key, column]``; unused
    slots ``-inf``. One set of every candidate key in order (the whole set with ``pair_docs="any"``) is
    ``scores32`` itself; otherwise the rows go into a buffer reused across calls (a fresh one of these
    megabytes costs more in page faults than the copy itself)."""
    n_set, n_slot = idx.shape
    if n_set == 1 and n_slot == scores32.shape[0] and bool(smask.all()) and bool((idx[0] == torch.arange(
            n_slot, device=idx.device)).all()):
        return scores32
    g = torch.index_select(scores32, 0, idx.reshape(-1),
                           out=scratch("listwise_sets", (idx.numel(), scores32.shape[1]), scores32))
    if not bool(smask.all()):  # unused slots (they index key 0) hold -inf
        g.index_fill_(0, (~smask).reshape(-1).nonzero()[:, 0], -torch.inf)
    return g


def close_threshold(top: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """A float32 threshold at or below ``top - 2 bound``, below it by float32 roundings only.

    ``2 bound`` ``[column]`` is rounded up to float32 once (per column, not per score), the difference
    ``top - 2 bound`` ``[set, column]`` is taken in float32 and then stepped down once: the float32 subtraction
    is off by at most half a step, so the result is never above the float64 threshold. A float32 score is at
    least the float64 threshold only if it is at least this one, so comparing in float32 (a float64 operand
    would send every score through a conversion) counts every key the float64 comparison counts as close,
    and those within the roundings (relative 2^-23 of ``2 bound`` and of the difference) more, which only send a
    certain winner to the float64 rescoring.
    """
    thr = top - twice_bound32(bound)  # [set, column]
    return torch.nextafter(thr, thr.new_tensor(-torch.inf), out=thr)


def twice_bound32(bound: torch.Tensor) -> torch.Tensor:
    """``2 bound`` ``[column]`` rounded up to float32 (at least ``2 bound``), as :func:`close_threshold` takes it."""
    twice = (2 * bound).to(torch.float32)  # [column]
    return torch.where(twice.to(torch.float64) < 2 * bound, torch.nextafter(twice, twice.new_tensor(torch.inf)), twice)


@functools.lru_cache(maxsize=256)
def slot_weights(n_slot: int, device: torch.device) -> torch.Tensor:
    """``[2, slot]``: ones and the slot indices, so one product with the close keys ``[set, slot, column]``
    counts them and, where one is close, names its slot. Cached (read-only), as :func:`column_groups`."""
    return torch.stack([torch.ones(n_slot, device=device), torch.arange(n_slot, dtype=torch.float32, device=device)])


@functools.lru_cache(maxsize=256)
def column_groups(n_head: int, rows: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Count group ``head * n_source + source`` of each column ``[head * sum(rows)]`` of the scores.

    Cached (read-only): every set size of every bucket of every chunk asks for the same few, and building one
    costs more than the scatter it serves on the small sets.
    """
    source = torch.repeat_interleave(torch.arange(len(rows), device=device),
                                     torch.tensor(rows, device=device))  # [row]
    return (torch.arange(n_head, device=device)[:, None] * len(rows) + source[None]).reshape(-1)


def float32_scores(rows: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 scores ``[key, head * row]`` (keys first) of float64 ``rows`` ``[head, row, dim]`` against ``keys``
    ``[head, key, dim]`` and the rounding bound ``[head * row]`` of each row's scores (module
    :mod:`qkplast.analysis.certified_signs`); an infinite bound (every winner scored again) where float32 could
    overflow or torch runs float32 products in a lower precision. :func:`float32_product` does the same from
    float32 copies and norms made beforehand, as :func:`listwise_kernel` makes them once per chunk."""
    key_norm = torch.linalg.vector_norm(keys, dim=-1).amax(-1, keepdim=True)  # [head, 1]
    return float32_product(rows.to(torch.float32), torch.linalg.vector_norm(rows, dim=-1), keys.to(torch.float32),
                           key_norm)


def float32_product(rows32: torch.Tensor, row_norm: torch.Tensor, keys32: torch.Tensor,
                    key_norm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`float32_scores` from the float32 copies ``[head, row, dim]``, ``[head, key, dim]`` and the float64
    norms (``row_norm`` ``[head, row]`` of each row, ``key_norm`` ``[head, 1]`` the largest key's). The scores
    are written to a scratch buffer (:func:`qkplast.tensors.scratch`): valid until the thread's next call."""
    dim = rows32.shape[-1]
    scale = row_norm * key_norm  # [head, row]: ||q|| max ||k||
    bound = sign_bound(dim) * scale + dim * torch.finfo(torch.float32).tiny  # [head, row]
    if not (float32_products_are_exact_ieee(rows32.device) and bool((scale < 2.0**100).all())):
        bound = torch.full_like(bound, torch.inf)
    h, n_key, n_row = keys32.shape[0], keys32.shape[1], rows32.shape[1]
    out = scratch("listwise_scores", (n_key, h * n_row), keys32)  # [key, head * row]
    per_head = out.view(n_key, h, n_row).transpose(0, 1)  # [head, key, row] view of the keys-first layout
    if keys32.device.type == "cpu":
        # numpy's BLAS writes the strided view itself (a leading dimension of h * row): no product-sized copy
        matmul(keys32, rows32.transpose(1, 2), out=per_head)
    else:
        per_head.copy_(torch.bmm(keys32, rows32.transpose(1, 2)))
    return out, bound.reshape(-1)


def listwise_kernel(rot: Rotated, sets: SetPlan, opt: AnalysisOptions) -> ListwiseChunk:
    """Listwise plasticity (sizes other than 2) and the nearest-bucket softmax mass of a chunk of heads.

    Each bucket's scores are formed once, in one product of the captured queries and the model draws
    together against the bucket's eligible keys, and every set size (one pass over the sets for both
    sources) and the nearest-bucket mass read them.
    The products run in float32: winners are certified by a rounding bound and near-ties scored again in
    float64 (:func:`certified_winner_plasticity`), so the listwise values are those of float64 scores; the
    softmax weights take the float32 scores, each within ``bound`` of the exact one, so a weight's
    logarithm is within ``2 bound / sqrt(dim)`` of the exact one (of order 1e-5 here, far below the
    sampling error of a mass). Keys are centred, which shifts each query's scores by one constant: winners
    and softmax weights do not change. Softmax scores carry the attention scale ``1/sqrt(dim)``; the
    positional term alone is the same for every query of a bucket, so its softmax is taken once per
    pairing group (document).
    """
    qr, kr, model = rot.qr, rot.kr, rot.model
    h, dim, dev = qr.shape[0], qr.shape[-1], qr.device
    n_bucket, n_size = len(sets.buckets), len(sets.sizes)
    nan = lambda *shape: torch.full((h, *shape), float("nan"), dtype=torch.float64, device=dev)  # noqa: E731
    ap, ap_mc = nan(n_bucket, n_size), nan(n_bucket, n_size)
    near_pos, near_act = nan(n_bucket), nan(n_bucket)
    near_pos_doc, near_act_doc = nan(n_bucket, sets.n_doc), nan(n_bucket, sets.n_doc)
    cols = [c for c, m in enumerate(sets.sizes) if m != 2]
    scale = 1 / math.sqrt(dim)
    # the keys' float32 copies, float64 norms and drift coordinates, once per chunk and in position order
    # (SetPlan.key_order): a bucket's eligible keys are the first ones, a view
    k32 = scratch("listwise_keys32", tuple(kr.shape), kr, torch.float32).copy_(kr)  # [head, sample, dim]
    k32_sorted = torch.index_select(k32, 1, sets.key_order, out=scratch("listwise_keys32_sorted", tuple(kr.shape),
                                                                        k32))  # [head, sample, dim]
    k_norm_sorted, k_pos_sorted = (torch.index_select(x, 1, sets.key_order)  # [head, sample] each
                                   for x in (torch.linalg.vector_norm(kr, dim=-1), kr[..., 0]))
    for b, bs in enumerate(sets.buckets):  # buckets only; heads, queries, keys and sets are vectorised
        if bs is None:
            continue
        n_key = bs.keys.numel()
        k32, k_pos = k32_sorted[:, :n_key], k_pos_sorted[:, :n_key]  # [head, key, dim], [head, key]: views
        k_norm = k_norm_sorted[:, :n_key].amax(-1, keepdim=True)  # [head, 1]
        n_q = bs.queries.numel()
        rows64 = torch.index_select(qr, 1, bs.queries)  # [head, query, dim]: a query sits in one bucket only
        if cols:  # the model draws beside the captured queries: one product and one pass over each set size
            rows64 = torch.cat([rows64, model_draws(model, sets.z, b)], 1)  # [head, query + draw, dim]
        s32, bound = float32_product(rows64.to(torch.float32), torch.linalg.vector_norm(rows64, dim=-1), k32,
                                     k_norm)  # [key, head * row], [head * row]
        if cols:
            # near-ties are scored again in float64 from the samples themselves and the draws
            exact = lambda hh, rr, kk, bs=bs, rows64=rows64: (  # noqa: E731
                rows64[hh, rr][:, None] * kr[hh[:, None], bs.keys[kk]]).sum(-1)
            for c, (idx, smask) in zip(cols, bs.sets):
                if idx.shape[0] == 0:
                    continue
                both = certified_winner_plasticity(s32, bound, idx, smask, exact, h, (opt.mc_unbiased, True),
                                                   rows=(n_q, sets.z.shape[0]))  # [source, head, set]
                ap_mc[:, b, c], ap[:, b, c] = torch.nanmean(both, -1)
        if not bool(bs.has.any()):
            continue
        block = torch.tensor(-torch.inf, dtype=torch.float64, device=dev)
        nearest = bs.nearest.to(torch.float64)
        # the positional term alone is the bucket's fitted mean of coordinate 1 times the key's: one softmax per group
        s_pos = (model.mean[:, b, 0, None] * k_pos * scale)[:, None, :]  # [head, 1, key]
        w_pos = torch.softmax(torch.where(bs.key_group[None], s_pos, block), -1)  # [head, group, key]
        mass_pos = (w_pos @ nearest)[:, bs.query_group]  # [head, query]
        scores = s32.view(s32.shape[0], h, -1)[..., :n_q]  # [key, head, query]: the captured rows
        mass_act = softmax_mass(scores, scale, bs.key_group, bs.query_group, bs.nearest)  # [head, query]
        for mass, dst, dst_doc in ((mass_pos, near_pos, near_pos_doc), (mass_act, near_act, near_act_doc)):
            dst[:, b] = masked_set_mean(mass, bs.has)
            dst_doc[:, b] = _doc_means(mass, bs.has, bs.query_doc, sets.n_doc)
    return ListwiseChunk(ap, ap_mc, near_pos, near_act, near_pos_doc, near_act_doc)


def softmax_mass(scores: torch.Tensor, scale: float, key_group: torch.Tensor, query_group: torch.Tensor,
                 nearest: torch.Tensor) -> torch.Tensor:
    """Softmax mass ``[head, query]`` on the ``nearest`` keys, each query's softmax over its own group's keys.

    Parameters
    ----------
    scores : Tensor ``[key, head, query]``
        float32 scores ``q^T k`` (keys first, as :func:`float32_product` writes them); times ``scale`` in the
        softmax.
    key_group : Tensor ``[group, key]``
        The keys of each pairing group (one group of every key with ``pair_docs="any"``).
    query_group : Tensor ``[query]``
        The group of each query.
    nearest : Tensor ``[key]``
        The keys whose mass is wanted.

    Notes
    -----
    The weights stay in the keys-first layout of the scores: each query's largest score in its group is
    subtracted, the exponentials are formed once, and one product with the groups' key masks gives every
    group's total and nearest sums; each query reads its own group's. A key of another group may score above
    the query's largest: its exponent is clamped at 0 (a finite weight) before the product leaves it out. The
    exponentials are float32 (rounding about 1e-7 relative, far below the scores' bound), the ratio float64.
    A query whose group has no keys gets NaN (0 / 0), as a softmax over no keys.
    """
    n_key, h, n_q = scores.shape
    n_group = key_group.shape[0]
    whole = n_group == 1 and bool(key_group.all())  # one group of every key (pair_docs="any", one document)
    if whole:
        top = scores.amax(0)  # [head, query]
    else:
        # each key's group; a key of no query's group goes to an extra group no query reads
        kg = torch.where(key_group.any(0), key_group.to(torch.uint8).argmax(0), n_group)  # [key]
        tops = torch.full((n_group + 1, h, n_q), -torch.inf, dtype=scores.dtype, device=scores.device)
        tops.scatter_reduce_(0, kg[:, None, None].expand_as(scores), scores, "amax")  # [group + 1, head, query]
        top = tops.gather(0, query_group[None, None, :].expand(1, h, n_q))[0]  # [head, query]
    # into a per-thread buffer: a fresh tensor of the scores' size costs more in page faults than the subtraction
    e = torch.sub(scores, top, out=scratch("softmax_weights", tuple(scores.shape), scores)).mul_(scale)  # [key, head, query]
    e = e.exp_() if whole else e.clamp_max_(0).exp_()
    w = torch.cat([key_group, key_group & nearest[None]]).to(scores.dtype)  # [2 * group, key]
    sums = (w @ e.view(n_key, h * n_q)).view(2, n_group, h, n_q).to(torch.float64)  # totals, nearest sums
    total, near = sums.gather(1, query_group[None, None, None, :].expand(2, 1, h, n_q))[:, 0]  # [head, query] each
    return near / total


def masked_set_mean(x: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """Mean over the last axis of ``x`` ``[head, n]`` where ``ok`` ``[n]`` holds and ``x`` is not NaN; NaN where none."""
    good = ok[None] & ~torch.isnan(x)
    c = good.sum(-1)
    s = torch.where(good, x, torch.zeros_like(x)).sum(-1)
    return torch.where(c > 0, s / c.clamp_min(1), torch.full_like(s, float("nan")))


def listwise_dataset(chunks: list[ListwiseChunk], sets: SetPlan, buckets: np.ndarray, doc_ids: np.ndarray,
                     ap: np.ndarray, ap_mc: np.ndarray, n_model_queries: int) -> xr.Dataset:
    """The Dataset of :func:`listwise` from consecutive chunks of heads; ``ap``/``ap_mc`` ``[head, bucket]`` are
    the pairwise values, which the set size 2 holds (it is the same estimator on the same pairs)."""
    cat = lambda name: to_numpy(torch.cat([getattr(c, name) for c in chunks]))  # noqa: E731
    ap_set, ap_set_mc = cat("ap_set"), cat("ap_set_mc")
    for c, m in enumerate(sets.sizes):
        if m == 2:
            ap_set[..., c], ap_set_mc[..., c] = ap, ap_mc
    dims = ("head", "query_bucket", "set_size")
    ds = xr.Dataset(
        {
            "ap_set": (dims, ap_set),
            "ap_set_mc": (dims, ap_set_mc),
            "nearest_mass_position": (("head", "query_bucket"), cat("near_pos")),
            "nearest_mass": (("head", "query_bucket"), cat("near_act")),
            "nearest_mass_position_doc": (("head", "query_bucket", "document"), cat("near_pos_doc")),
            "nearest_mass_doc": (("head", "query_bucket", "document"), cat("near_act_doc")),
            "nearest_share_doc": (("query_bucket", "document"), sets.share_doc),
        },
        coords={"query_bucket": buckets, "set_size": np.asarray(sets.sizes, dtype=np.int64),
                "n_sets": (("query_bucket", "set_size"), sets.n_sets),
                "nearest_share": ("query_bucket", sets.share), "document": np.asarray(doc_ids).astype(str)},
    )
    ds["ap_set"].attrs["meaning"] = ("listwise plasticity (1 - sum_i P_i^2) / (1 - 1/m) of the winner distribution under the "
                                     "fitted Gaussian model: closed form (eq. 4.14) at m = 2, model draws otherwise; set_size 0 = whole eligible set")
    ds["ap_set_mc"].attrs["meaning"] = "listwise plasticity from the bucket's captured queries (unbiased n/(n-1)), same sets"
    ds["nearest_mass_position"].attrs["meaning"] = "softmax mass on the nearest eligible bucket from the positional term alone"
    ds["nearest_mass"].attrs["meaning"] = "softmax mass on the nearest eligible bucket from the captured queries' full scores"
    ds["nearest_mass_doc"].attrs["meaning"] = "nearest_mass over the queries of each document (the unit of its intervals)"
    ds["nearest_mass_position_doc"].attrs["meaning"] = "nearest_mass_position over the queries of each document"
    ds.attrs["n_model_queries"] = n_model_queries
    return ds


def listwise(capture: xr.Dataset, options: AnalysisOptions | None = None, **overrides) -> xr.Dataset:
    """Listwise plasticity ``ap_set``/``ap_set_mc`` (head, query_bucket, set_size) and the nearest-bucket softmax mass.

    Returns
    -------
    xarray.Dataset
        ``ap_set`` (fitted Gaussian model), ``ap_set_mc`` (captured queries),
        ``n_sets`` (query_bucket, set_size); ``nearest_mass_position``,
        ``nearest_mass`` (head, query_bucket) and ``nearest_share`` (query_bucket), and the same per document
        (``..._doc``, dim ``document``), see :func:`listwise_kernel`. Set sizes come from
        ``options.set_sizes`` (0: the whole eligible set of a document). :func:`qkplast.analyze` computes
        the same in its own pass over the heads.
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    capture = analysis_vectors(capture, opt)  # head_dims, query_scale (identity under the defaults)
    dev = resolve_device(opt.device)
    lay = pair_plan(capture, opt, dev, warn=False)
    sets = set_plan(capture, lay, opt, dev)

    def one_chunk(sl: slice):
        rot = rotated_clouds(cloud_moments(*head_vectors(capture, sl, dev), lay.t, scatter=False), lay, opt)
        pp, pp_mc = pair_kernel(rot.qr, rot.kr, lay.pi, lay.pj, rot.model, lay.qidx, lay.qmask, opt.mc_unbiased)
        return weighted_pair_mean(pp, lay.pweight), weighted_pair_mean(pp_mc, lay.pweight), listwise_kernel(rot, sets, opt)

    chunk = opt.head_chunk or auto_chunk(bytes_per_head(lay, capture.sizes["dim"], opt, True, dev), dev, LISTWISE_CPU_MB)
    ap, ap_mc, chunks = zip(*map_head_chunks(one_chunk, capture.sizes["head"], chunk, dev))
    return listwise_dataset(list(chunks), sets, lay.buckets, np.unique(capture["doc"].values),
                            to_numpy(torch.cat(ap)), to_numpy(torch.cat(ap_mc)), opt.n_model_queries)


# --------------------------------------------------------------------------- across heads


#: values of one row within this fraction of the row's largest magnitude are ties (rounding, not order)
TIE_TOLERANCE = 1e-9


def tied_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks ``[rep, n]`` of each row of ``x``, ties sharing their average rank (Spearman's rule for ties).

    Values within ``TIE_TOLERANCE`` times the row's largest magnitude of the value before them in sorted
    order are tied: listwise plasticity from a few dozen draws takes discrete values, so heads often share
    one, and their means over buckets then differ by rounding alone (the order of a sum); an order decided
    by rounding would move the correlation with the chunking of the heads.
    """
    order = np.argsort(x, axis=1, kind="stable")
    xs = np.take_along_axis(x, order, 1)  # [rep, n] sorted
    tol = TIE_TOLERANCE * np.abs(x).max(1, keepdims=True)
    n = x.shape[1]
    pos = np.broadcast_to(np.arange(n, dtype=float), x.shape)
    starts = np.concatenate([np.ones((x.shape[0], 1), bool), np.diff(xs, axis=1) > tol], 1)  # a group begins
    ends = np.concatenate([starts[:, 1:], np.ones((x.shape[0], 1), bool)], 1)  # a group ends
    first = np.maximum.accumulate(np.where(starts, pos, 0), axis=1)  # [rep, n] first position of the group
    last = np.minimum.accumulate(np.where(ends, pos, n)[:, ::-1], axis=1)[:, ::-1]  # last position
    ranks = np.empty_like(pos)
    np.put_along_axis(ranks, order, (first + last) / 2, 1)
    return ranks


def rank_correlation(rx: np.ndarray, ry: np.ndarray) -> np.ndarray:
    """Pearson correlation of each row pair of ranks ``[rep, n]``."""
    rx = rx - rx.mean(1, keepdims=True)
    ry = ry - ry.mean(1, keepdims=True)
    return (rx * ry).sum(1) / np.sqrt((rx * rx).sum(1) * (ry * ry).sum(1))


def spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row pair of ``x``, ``y`` ``[rep, n]`` (ties share their average rank,
    :func:`tied_ranks`)."""
    return rank_correlation(tied_ranks(x), tied_ranks(y))


def head_level(metrics: xr.Dataset, variable: str = "ap_set") -> xr.DataArray:
    """Per-head mean over query buckets of a ``(head, query_bucket, set_size)`` variable (NaN buckets left out)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return metrics[variable].mean("query_bucket", skipna=True)


def listwise_means(lw: xr.Dataset) -> dict:
    """Per set size: the mean over heads of each head's mean ``ap_set``/``ap_set_mc`` over buckets, and the Spearman
    correlation across heads of pairwise (m = 2) with listwise AP on the buckets where the listwise value exists."""
    out = {}
    for m in lw.set_size.values:
        for name in ("ap_set", "ap_set_mc"):
            out[(int(m), name)] = float(np.nanmean(head_level(lw, name).sel(set_size=m).values))
        if int(m) != 2:
            x, y = pairwise_and_listwise(lw, int(m))
            out[(int(m), "rho")] = float(spearman_rows(x[None], y[None])[0]) if len(x) >= 3 else np.nan
    return out


def pairwise_and_listwise(metrics: xr.Dataset, set_size: int, variable: str = "ap_set"):
    """Per-head pairwise (m = 2) and listwise (``set_size``) values, each the mean over the query buckets where the
    listwise value exists (so the two average the same buckets); heads with either missing left out."""
    sub = metrics[variable]
    both = sub.sel(set_size=set_size).notnull() & sub.sel(set_size=2).notnull()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        x = sub.sel(set_size=2).where(both).mean("query_bucket", skipna=True).values
        y = sub.sel(set_size=set_size).where(both).mean("query_bucket", skipna=True).values
    ok = ~np.isnan(x) & ~np.isnan(y)
    return x[ok], y[ok]

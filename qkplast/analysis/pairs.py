"""Query buckets and the key pairs drawn and weighted in them, shared by every head (thesis section 4.4).

Attention plasticity (:mod:`qkplast.analysis.plasticity`) averages a pairwise value over key pairs ``(i, j)``
per query bucket. Which pairs enter that average depends on positions and documents only, never on a head's
vectors, so it is decided here once per capture:

- :func:`bucket_positions`: the query buckets, their representative positions ``tau``, widths and query counts;
- :func:`sample_key_pairs`: the admissible pairs of each bucket (earlier keys, one document), all of them or a
  uniform draw of ``n_pairs`` (:class:`KeyPairs`); :func:`pairs_without` restricts drawn pairs to a subset of
  the samples (a jackknife over documents keeps the full capture's draw);
- :func:`pair_weights`: the weight of each drawn pair in its bucket's average (uniform or Definition 4.3's);
- :func:`pair_plan`: all of it on the analysis device, with each bucket's query list and each pair's cell of
  the 2D map (:class:`PairPlan`, the layout every kernel of :mod:`qkplast.analysis.plasticity` reads).

:class:`PlasticityWarning` lives here because the pair plan is the first to know that a bucket's plasticity is
undefined (too few queries, fewer than two eligible keys); the kernels raise it too.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr

from qkplast.tensors import as_f64
from qkplast.options import AnalysisOptions

__all__ = ["KeyPairs", "PairPlan", "PlasticityWarning", "bucket_positions", "pair_plan", "pair_weights",
           "pairs_without", "sample_key_pairs"]


class PlasticityWarning(UserWarning):
    """A documented NaN: a bucket or pair whose plasticity is undefined."""


@dataclass
class KeyPairs:
    """Key pairs per query bucket, as sample indices shared by every head.

    ``i``, ``j``, ``valid`` are ``[query_bucket, pair]``; padded entries have
    ``valid=False``. ``tau`` is the representative position of each query bucket.
    """

    i: np.ndarray
    j: np.ndarray
    valid: np.ndarray
    tau: np.ndarray
    n_admissible: np.ndarray  # [query_bucket] admissible pairs before sampling


def bucket_positions(capture: xr.Dataset, query_position: str = "midpoint"):
    """Query buckets, their representative positions tau, widths and query counts."""
    seq_len, size = int(capture.attrs["seq_len"]), int(capture.attrs["bucket_size"])
    n_bucket = -(-seq_len // size)
    buckets = np.arange(n_bucket)
    width = np.minimum((buckets + 1) * size, seq_len) - buckets * size
    bucket = capture["bucket"].values
    counts = np.bincount(bucket, minlength=n_bucket)
    if query_position == "midpoint":
        tau = buckets * size + width / 2.0
    else:
        sums = np.bincount(bucket, weights=capture["position"].values.astype(float), minlength=n_bucket)
        with np.errstate(invalid="ignore", divide="ignore"):
            tau = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return buckets, tau, width, counts


def sample_key_pairs(capture: xr.Dataset, options: AnalysisOptions) -> KeyPairs:
    """Draw key pairs per query bucket (the same for every head).

    Admissible pairs for query bucket ``j``: two distinct samples whose keys are
    eligible (``options.eligible_keys``) and, with ``pair_docs="same"``, from one
    document. When there are at most ``n_pairs`` of them all are kept;
    otherwise ``n_pairs`` are drawn uniformly (with replacement) by first
    choosing a document with probability proportional to its pair count.
    """
    _, tau, _, _ = bucket_positions(capture, options.query_position)
    rng = np.random.default_rng(options.seed)
    pos, bucket = capture["position"].values, capture["bucket"].values
    docs = capture["doc"].values if options.pair_docs == "same" else np.zeros(pos.shape, dtype=int)
    _, doc_code = np.unique(docs, return_inverse=True)
    n_bucket, n_pairs = len(tau), options.n_pairs
    out_i = np.zeros((n_bucket, n_pairs), dtype=np.int64)
    out_j = np.zeros((n_bucket, n_pairs), dtype=np.int64)
    valid = np.zeros((n_bucket, n_pairs), dtype=bool)
    n_adm = np.zeros(n_bucket, dtype=np.int64)
    for qb in range(n_bucket):  # a loop over buckets only: pairs are drawn vectorised
        if options.eligible_keys == "earlier_buckets":
            eligible = np.flatnonzero(bucket < qb)
        else:
            eligible = np.flatnonzero(pos < tau[qb]) if np.isfinite(tau[qb]) else np.array([], dtype=np.int64)
        if eligible.size < 2:
            continue
        order = eligible[np.argsort(doc_code[eligible], kind="stable")]  # grouped by document
        _, start, count = np.unique(doc_code[order], return_index=True, return_counts=True)
        per_doc = count * (count - 1) // 2
        n_adm[qb] = per_doc.sum()
        if n_adm[qb] == 0:
            continue
        if n_adm[qb] <= n_pairs:
            # every admissible pair, enumerated per document by its upper triangle
            ii, jj = [], []
            for s, c in zip(start[per_doc > 0], count[per_doc > 0]):
                a, b = np.triu_indices(c, 1)
                ii.append(order[s + a]), jj.append(order[s + b])
            ii, jj = np.concatenate(ii), np.concatenate(jj)
        else:
            d = rng.choice(len(count), size=n_pairs, p=per_doc / per_doc.sum())
            a = rng.integers(0, count[d])
            b = rng.integers(0, count[d] - 1)
            b = b + (b >= a)  # a distinct second key
            ii, jj = order[start[d] + a], order[start[d] + b]
        m = len(ii)
        out_i[qb, :m], out_j[qb, :m], valid[qb, :m] = ii, jj, True
    return KeyPairs(out_i, out_j, valid, tau, n_adm)


def pairs_without(pairs: KeyPairs, keep: np.ndarray) -> KeyPairs:
    """The pairs of a capture restricted to the samples ``keep`` (a boolean mask), indexed into the kept samples.

    A pair that loses a key is padding (``valid`` False); the order of the rest is unchanged. With ``keep``
    the samples of all documents but one, these are the left-out capture's share of the full capture's pairs,
    so a jackknife over documents does not redraw the pairs (their draw would add its own noise to every
    leave-one-out value).
    """
    new = np.cumsum(keep) - 1  # [sample] index among the kept samples
    ok = pairs.valid & keep[pairs.i] & keep[pairs.j]
    return KeyPairs(np.where(ok, new[pairs.i], 0), np.where(ok, new[pairs.j], 0), ok, pairs.tau, pairs.n_admissible)


# --------------------------------------------------------------------------- the plan every head shares


@dataclass
class PairPlan:
    """Everything about buckets and pairs that is shared by all heads."""

    buckets: np.ndarray
    width: np.ndarray
    counts: np.ndarray
    pairs: KeyPairs
    t: torch.Tensor  # [sample]
    onehot: torch.Tensor  # [bucket, sample]
    tau: torch.Tensor  # [bucket]
    pi: torch.Tensor  # [bucket, pair]
    pj: torch.Tensor
    pvalid: torch.Tensor  # [bucket, pair], False for padding and for buckets with too few queries
    qidx: torch.Tensor  # [bucket, n_max]
    qmask: torch.Tensor
    pweight: torch.Tensor  # [bucket, pair] weight of each pair in ap (options.pair_weight); 0 where not valid
    cell: torch.Tensor  # [bucket * pair] cell of each pair in the 2D map (inter-key by query-to-midpoint distance)
    n_cells: int


def pair_weights(pairs: KeyPairs, position: np.ndarray, rule: str) -> np.ndarray:
    """Weight ``[bucket, pair]`` of each drawn pair in its bucket's average (``AnalysisOptions.pair_weight``).

    "uniform": 1. "prefix": Definition 4.3's ``1/(j-1) - 1/(t-1)``, with ``j`` the
    1-indexed position of the pair's later key and ``t = tau + 1``; a pair whose
    later key is not below ``t - 1`` gets 0 (no prefix shorter than t holds it).
    Padding gets 0 either way.
    """
    if rule == "uniform":
        return pairs.valid.astype(float)
    j = np.maximum(position[pairs.i], position[pairs.j]).astype(float) + 1  # [bucket, pair], >= 2
    t = pairs.tau[:, None] + 1
    with np.errstate(invalid="ignore", divide="ignore"):
        w = 1.0 / (j - 1) - 1.0 / (t - 1)
    return np.where(pairs.valid & np.isfinite(w) & (w > 0), w, 0.0)


def pair_plan(capture: xr.Dataset, opt: AnalysisOptions, dev: torch.device, warn: bool,
                      pairs: KeyPairs | None = None) -> PairPlan:
    """Buckets, key pairs, query lists, pair weights and map cells of a capture: what every head shares.

    ``pairs`` (default: drawn by :func:`sample_key_pairs`) are given when an analysis must use pairs drawn
    once for a larger capture (a jackknife over documents keeps each left-out capture's share of them,
    :func:`pairs_without`).
    """
    buckets, _, width, counts = bucket_positions(capture, opt.query_position)
    pairs = sample_key_pairs(capture, opt) if pairs is None else pairs
    few = (counts < opt.min_bucket_samples) | (counts == 0)
    no_pairs = ~pairs.valid.any(1)
    if warn and few.any():
        warnings.warn(
            f"query buckets {buckets[few].tolist()} have fewer than {opt.min_bucket_samples} queries "
            f"(counts {counts[few].tolist()}): their plasticity is NaN for all heads",
            PlasticityWarning, stacklevel=3,
        )
    if warn and (no_pairs & ~few).any():
        warnings.warn(
            f"query buckets {buckets[no_pairs & ~few].tolist()} have fewer than two eligible keys "
            f"(eligible_keys={opt.eligible_keys!r}, pair_docs={opt.pair_docs!r}): their plasticity is NaN for all heads",
            PlasticityWarning, stacklevel=3,
        )
    n_bucket = len(buckets)
    bucket = torch.as_tensor(capture["bucket"].values, device=dev)
    onehot = (bucket[None, :] == torch.arange(n_bucket, device=dev)[:, None]).to(torch.float64)
    n_max = max(int(counts.max()), 1)
    qidx = np.zeros((n_bucket, n_max), dtype=np.int64)
    qmask = np.zeros((n_bucket, n_max), dtype=bool)
    order = np.argsort(capture["bucket"].values, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    for b in range(n_bucket):  # a loop over buckets, not over samples or heads
        members = order[starts[b]: starts[b + 1]]
        qidx[b, : len(members)], qmask[b, : len(members)] = members, True
    pvalid = pairs.valid & ~few[:, None]
    pweight = np.where(pvalid, pair_weights(pairs, capture["position"].values, opt.pair_weight), 0.0)
    return PairPlan(
        buckets, width, counts, pairs, as_f64(capture["position"], dev), onehot, as_f64(pairs.tau, dev),
        torch.as_tensor(pairs.i, device=dev), torch.as_tensor(pairs.j, device=dev),
        torch.as_tensor(pvalid, device=dev), torch.as_tensor(qidx, device=dev), torch.as_tensor(qmask, device=dev),
        as_f64(pweight, dev), torch.as_tensor(_map_cells(capture, pairs, opt).reshape(-1), device=dev),
        opt.map_bins**2,
    )


def _map_cells(capture: xr.Dataset, pairs: KeyPairs, opt: AnalysisOptions) -> np.ndarray:
    """Cell ``[bucket, pair]`` of each pair in the 2D map: positions only, hence shared by all heads."""
    pos = capture["position"].values.astype(float)
    key_dist = np.abs(pos[pairs.i] - pos[pairs.j])  # [bucket, pair]
    q_dist = pairs.tau[:, None] - 0.5 * (pos[pairs.i] + pos[pairs.j])
    edges = np.linspace(0.0, int(capture.attrs["seq_len"]), opt.map_bins + 1)
    kb = np.clip(np.digitize(key_dist, edges) - 1, 0, opt.map_bins - 1)
    qb = np.clip(np.digitize(q_dist, edges) - 1, 0, opt.map_bins - 1)
    return kb * opt.map_bins + qb

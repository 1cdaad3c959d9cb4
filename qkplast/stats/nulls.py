"""Permutation null baselines for the corrections page's empirical claims (issue 9, item 11).

Each observed ratio has a spread that is partly sampling noise of ~30 queries
per bucket. A null breaks exactly the structure the claim is about and keeps
everything else (the keys, the pairs, the per-coordinate distributions):

* :func:`diagonal_null` (``v_diag / v_full``, eq. 4.12 vs Lemma A.1): each
  rotated semantic coordinate is permuted independently across the bucket's
  queries, which keeps every variance and destroys the off-diagonal
  covariance. Under the null ``v_diag / v_full`` differs from 1 by noise only.
* :func:`bucket_shuffle_null` (per head, median over the last bucket's pairs of
  ``max_b v / min_b v``): bucket labels are permuted among the samples of each
  document, so the buckets' statistics differ by sampling only.
* :func:`independence_null` (``v_joint / v_indep``, assumption A.1-A.2): the
  rotated coordinate 1 is permuted within each bucket, which breaks its
  dependence on the semantic coordinates and keeps both marginals.

Each returns an ``xarray.Dataset`` with the observed summary (``median``,
``q05``, ``q95`` and the spread statistic tested) beside the same summary in
every permutation (``null``), the null's median and 5-95% range of each
summary, and the permutation p-value ``(1 + #{null >= observed}) / (1 +
n_perm)`` of the spread statistic. Permutations are drawn once per query
bucket (the same for every head, in the batched form), vectorised over
permutations in chunks; to fit the CPU budget the pairs are a fixed random
subset of each bucket's pairs (``pairs_per_bucket``; stated in the attrs) and
the observed summary is reported on that subset and on all pairs.

How the permutations are applied (the kernels below; the draws are those of a permutation at a time, chunk after
chunk, so every null value is the one a per-permutation loop gives, up to the order of floating-point sums):

* :func:`permuted_energy` (the diagonal null): a permutation is shared by every head, so each bucket's queries are
  kept with the permuted axis contiguous (``[head, coordinate, query]``, exact bucket sizes, no padding), gathered
  along it for a block of heads at a time (the block's temporaries stay in the cache and are reused, instead of a
  fresh ``[perm, head, bucket, n_max, dim]`` gather per chunk) and projected on the pairs by one batched product.
* :func:`bucket_moments` (the bucket-shuffle null): a relabelling is a one-hot ``[bucket, sample]`` matrix, so the
  relabelled buckets' sums are one matrix product per block of heads. It does the bucket count's times the
  additions of a scatter, at a matrix product's rate (a scatter over ``[head, perm, sample, dim]`` indices writes
  every element through its own index); and the squares enter already reduced over coordinates to one number
  per pair (``sum_d delta_d^2 x_d^2``, :func:`bucket_spread`), so each sample carries ``dim - 1 + pair`` values,
  not ``2 (dim - 1)``.
* :func:`cross_terms` (the independence null): coordinate 1 is the only coordinate permuted, so only it is
  gathered (``[head, bucket, perm * n_max]``) and the cross term is a batched product with the fixed projections.
* :func:`quantiles`: ``torch.quantile``'s values from one sort of the batch (numpy's vectorised sort on the CPU,
  about ten times torch's there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr

from qkplast.tensors import (argsort_last, as_f64, auto_chunk, map_head_chunks, matmul, resolve_device, scratch,
                             sort_last)
from qkplast.options import AnalysisOptions
from qkplast.analysis.vectors import analysis_vectors
from qkplast.analysis.pairs import pair_plan
from qkplast.analysis.plasticity import query_model, rotate
from qkplast.stats.decision import null_verdict
from qkplast.stats.shuffles import off_axis_slope, position_shuffle_null

SUMMARIES = ("median", "q05", "q95", "spread")
#: The quantiles of every summary, in the order of the first three of :data:`SUMMARIES`.
QUANTILES = (0.5, 0.05, 0.95)
#: CPU budget (MB) of a head block's temporaries in the permutation kernels: the blocks' buffers are reused block
#: after block (:func:`qkplast.tensors.scratch`), where one gather of a whole chunk (hundreds of MB) was written to
#: freshly mapped memory, a page fault per 4 KB. The diagonal null of the default run (270 heads, 1000 permutations)
#: took 17-21 s of CPU on one thread in blocks of 24 to 64 heads (no clear optimum between), against 90 s of CPU
#: for the former whole-chunk gather, both measured beside other work on the 2-core machine
NULL_CPU_MB = 8
#: Permutations (whole draw chunks) per pass of the workers over the heads in :func:`diagonal_null`.
PERM_BATCH = 32


# --------------------------------------------------------------------------- order statistics


def quantiles(x: torch.Tensor, q) -> torch.Tensor:
    """``torch.quantile(x, q, dim=-1)`` (linear interpolation) from one sort of the batch.

    Parameters
    ----------
    x : torch.Tensor
        ``[..., n]`` values, ``n >= 1``.
    q : sequence of float
        Probabilities in [0, 1].

    Returns
    -------
    torch.Tensor
        ``[len(q), ...]``: the same values as ``torch.quantile`` bit for bit (the same ranks, order statistics
        and ``lerp``; NaN for a row that holds a NaN), without its size limit.
    """
    n = x.shape[-1]
    qt = torch.as_tensor(q, dtype=x.dtype, device=x.device)  # [q]
    ranks = qt * (n - 1)  # as torch.quantile: the rank in the sorted row, interpolated linearly
    below = ranks.to(torch.long)
    above = ranks.ceil().to(torch.long)
    weights = ranks - below
    s = sort_last(x)  # [..., n]
    lo = s[..., below].movedim(-1, 0)  # [q, ...]
    hi = s[..., above].movedim(-1, 0)
    shape = (len(qt),) + (1,) * (lo.dim() - 1)
    out = torch.lerp(lo, hi, weights.view(shape).expand_as(lo))
    has_nan = torch.isnan(s[..., -1])  # NaN sorts last: a row holds one when its largest is NaN
    return torch.where(has_nan, torch.full_like(out, float("nan")), out)


def _summary(x: torch.Tensor, spread: str) -> torch.Tensor:
    """``[..., n] -> [..., 4]``: median, 5% and 95% quantiles and the spread statistic."""
    q = quantiles(x, QUANTILES)  # [3, ...]
    s = torch.log(q[2] / q[1]) if spread == "log_q95_over_q05" else q[0]
    return torch.stack([q[0], q[1], q[2], s], -1)


def _result(observed, observed_all, null, statistic, spread, n_perm, pairs, seed, how) -> xr.Dataset:
    null = null.cpu().numpy()
    obs = observed.cpu().numpy()
    p = (1 + np.sum(null[:, 3] >= obs[3])) / (1 + n_perm)
    return xr.Dataset(
        {
            "observed": ("summary", obs),
            "observed_all_pairs": ("summary", observed_all.cpu().numpy()),
            "null": (("permutation", "summary"), null),
            "null_median": ("summary", np.median(null, 0)),
            "null_q05": ("summary", np.quantile(null, 0.05, 0)),
            "null_q95": ("summary", np.quantile(null, 0.95, 0)),
            "p_value": ((), p),
        },
        coords={"summary": list(SUMMARIES)},
        attrs={"statistic": statistic, "spread_statistic": spread, "n_perm": n_perm, "pairs_per_bucket": pairs,
               "seed": seed, "null": how,
               "p_value": "one-sided permutation p-value of the spread statistic: (1 + #{null >= observed}) / (1 + n_perm)"},
    )


class _Setup:
    """Rotated queries per bucket (padded, centred), the pair subset's rotated key differences and the model."""

    def __init__(self, capture, options, pairs_per_bucket, seed, positional_fit="global"):
        opt = AnalysisOptions.from_kwargs(options, positional_fit=positional_fit, covariance="diagonal",
                                          semantic_stats="per_bucket")
        capture = analysis_vectors(capture, opt)
        dev = resolve_device(opt.device)
        lay = pair_plan(capture, opt, dev, warn=False)
        _, qr, kr = rotate(as_f64(capture["q"], dev), as_f64(capture["k"], dev), lay.t)
        self.model = query_model(qr, lay.t, lay.onehot, lay.tau, opt)
        self.ok_bucket = torch.as_tensor(lay.counts >= opt.min_bucket_samples, device=dev)
        rng = np.random.default_rng(seed)
        valid = lay.pvalid.cpu().numpy()
        n_bucket, n_sub = valid.shape[0], pairs_per_bucket
        sub = np.zeros((n_bucket, n_sub), dtype=np.int64)
        sub_ok = np.zeros((n_bucket, n_sub), dtype=bool)
        for b in range(n_bucket):  # a loop over buckets only: choose each bucket's pair subset
            idx = np.flatnonzero(valid[b])
            take = rng.choice(idx, size=min(n_sub, idx.size), replace=False) if idx.size else idx
            sub[b, : take.size], sub_ok[b, : take.size] = take, True
        self.sub = torch.as_tensor(sub, device=dev)
        self.sub_ok = torch.as_tensor(sub_ok, device=dev)
        pi, pj = torch.gather(lay.pi, 1, self.sub), torch.gather(lay.pj, 1, self.sub)
        self.delta = kr[:, pi] - kr[:, pj]  # [head, bucket, sub, dim]
        self.valid_all = lay.pvalid
        mean_b = torch.einsum("bs,hsd->hbd", lay.onehot, qr) / lay.onehot.sum(1).clamp_min(1)[:, None]
        self.x = (qr[:, lay.qidx] - mean_b[:, :, None]) * lay.qmask[None, :, :, None]  # [head, bucket, n_max, dim]
        self.qmask, self.n = lay.qmask, lay.qmask.sum(1).to(qr.dtype)  # [bucket]
        self.qr, self.kr, self.lay, self.dev = qr, kr, lay, dev
        # the pairs the permutations read: subset pairs of usable buckets (at least min_bucket_samples queries)
        self.ok = self.sub_ok & self.ok_bucket[:, None]  # [bucket, sub]

    def pair_differences(self, heads: slice = slice(None)) -> torch.Tensor:
        """Rotated key differences of every drawn pair of the heads ``heads`` ``[head, bucket, pair, dim]``."""
        kr = self.kr[heads]
        return kr[:, self.lay.pi] - kr[:, self.lay.pj]

    def bucket_delta_all(self, b: int) -> torch.Tensor:
        """The rotated key differences of every drawn pair of bucket ``b`` ``[head, pair, dim]``."""
        return self.kr[:, self.lay.pi[b]] - self.kr[:, self.lay.pj[b]]

    def all_pairs(self, ratio) -> torch.Tensor:
        """``ratio(delta, heads)`` ``[head, bucket, pair]`` of every valid drawn pair, flat in (head, bucket, pair)
        order.

        A few heads at a time (:func:`qkplast.tensors.map_head_chunks`): all pairs' differences and score deviations
        of all heads are hundreds of MB, each head's a few; the values are the same.
        """
        b, p = self.lay.pi.shape
        chunk = auto_chunk(8 * b * p * (3 * self.kr.shape[-1] + 2 * self.x.shape[2]), self.dev)

        def block(sl):
            return ratio(self.pair_differences(sl), sl)[:, self.valid_all]  # [head, valid pair]

        return torch.cat(map_head_chunks(block, self.kr.shape[0], chunk, self.dev)).reshape(-1)

    def head_chunk(self, bytes_per_head: float) -> int:
        """Heads per block of the permutation kernels: about :data:`NULL_CPU_MB` of temporaries on the CPU (the
        blocks as many as a multiple of the worker threads, so that none waits on the last), 1 GB on a GPU."""
        h = self.x.shape[0]
        chunk = min(auto_chunk(bytes_per_head, self.dev, NULL_CPU_MB), h)
        if self.dev.type != "cpu":
            return chunk
        workers = max(1, torch.get_num_threads())
        blocks = -(-h // chunk)
        blocks = -(-blocks // workers) * workers
        return -(-h // blocks)


def _bucket_permutations(mask: torch.Tensor, n_perm: int, extra: tuple, gen: torch.Generator,
                         slot_last: bool = False) -> torch.Tensor:
    """Random permutations of each bucket's valid slots ``[perm, bucket, n_max, *extra]`` (padding stays put).

    The keys are drawn in that shape whatever the layout asked for, so the draws do not depend on it;
    ``slot_last`` returns ``[perm, bucket, *extra, n_max]``, the slots sorted along a contiguous axis (the valid
    slots' permutation is the same: their keys are distinct, and all below the padding's).
    """
    keys = torch.rand((n_perm, *mask.shape, *extra), generator=gen, dtype=torch.float64, device=mask.device)
    pad = ~mask.reshape(1, *mask.shape, *([1] * len(extra)))
    keys = keys.masked_fill(pad, 2.0)  # padding sorts last, so valid slots permute among themselves
    if slot_last:
        return argsort_last(keys.movedim(2, -1))
    return argsort_last(keys.movedim(2, -1)).movedim(-1, 2)


def _ratio_diag_full(delta, var_diag, x, n, sigma2):
    """``v_diag / v_full`` ``[head, bucket, pair]`` from rotated deltas and centred queries (global fit)."""
    v_diag = (delta * delta * var_diag[:, :, None]).sum(-1)
    proj = torch.einsum("...hbmd,hbpd->...hbmp", x[..., 1:], delta[..., 1:])  # semantic score deviations
    v_full = (proj * proj).sum(-2) / (n - 1)[:, None] + delta[..., 0] ** 2 * sigma2[:, None, None]
    return v_diag / v_full


# --------------------------------------------------------------------------- the diagonal null


@dataclass
class DiagonalBucket:
    """One query bucket's part of the diagonal null: what its permutations act on and what they leave alone."""

    bucket: int
    x: torch.Tensor  # [head, dim-1, n] centred rotated semantic coordinates of the bucket's n queries, queries last
    delta: torch.Tensor  # [head, pair, dim-1] semantic coordinates of its usable subset pairs' key differences
    v_diag: torch.Tensor  # [head, pair] eq. 4.12's variance: every permutation keeps it
    v1: torch.Tensor  # [head, pair] the positional term of v_full, delta_1^2 sigma_pos^2
    n1: torch.Tensor  # [] n - 1, the variance's denominator


def diagonal_buckets(x: torch.Tensor, delta: torch.Tensor, var_diag: torch.Tensor, sigma2: torch.Tensor,
                     n: torch.Tensor, ok: torch.Tensor) -> list[DiagonalBucket]:
    """The buckets that hold a usable pair, each in the layout :func:`permuted_energy` reads.

    Parameters
    ----------
    x : torch.Tensor
        ``[head, bucket, n_max, dim]`` centred rotated queries, padding zero after each bucket's ``n`` queries.
    delta : torch.Tensor
        ``[head, bucket, pair, dim]`` rotated key differences of the pair subset.
    var_diag, sigma2 : torch.Tensor
        The query model's diagonal covariance ``[head, bucket, dim]`` and positional residual variance ``[head]``.
    n : torch.Tensor
        ``[bucket]`` query counts (float).
    ok : torch.Tensor
        ``[bucket, pair]`` the pairs that enter the statistic.
    """
    v_diag = (delta * delta * var_diag[:, :, None]).sum(-1)  # [head, bucket, pair], as _ratio_diag_full forms it
    v1 = delta[..., 0] ** 2 * sigma2[:, None, None]  # [head, bucket, pair]
    out = []
    for b in torch.nonzero(ok.any(1)).flatten().tolist():  # a loop over buckets only
        p = ok[b]
        m = int(n[b])
        out.append(DiagonalBucket(
            b, x[:, b, :m, 1:].transpose(1, 2).contiguous(),  # [head, dim-1, n]: the permuted axis contiguous
            delta[:, b][:, p][..., 1:].contiguous(), v_diag[:, b][:, p], v1[:, b][:, p], n[b] - 1))
    return out


def gather_index(perm: torch.Tensor) -> torch.Tensor:
    """``[1, dim, perm * n]`` the index :func:`permuted_energy` gathers with, from permutations ``[perm, dim, n]``:
    one row per coordinate, its permutations one after another, shared by every head (formed once per batch)."""
    k, d, n = perm.shape
    return perm.transpose(0, 1).reshape(1, d, k * n)


def permuted_energy(x: torch.Tensor, delta: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``sum_m (sum_d x[h, d, perm[k, d, m]] delta[h, p, d])^2`` for a block of heads: the semantic score
    deviations' sum of squares after permuting each coordinate's queries.

    Parameters
    ----------
    x : torch.Tensor
        ``[head, dim, n]`` one bucket's centred coordinates (queries along the contiguous last axis).
    delta : torch.Tensor
        ``[head, pair, dim]`` key differences.
    index : torch.Tensor
        ``[1, dim, perm * n]`` the :func:`gather_index` of ``perm`` ``[perm, dim, n]``, a permutation of the ``n``
        queries per coordinate shared by every head.

    Returns
    -------
    torch.Tensor
        ``[perm, head, pair]``.
    """
    h, d, n = x.shape
    p, kn = delta.shape[1], index.shape[-1]
    # the block's gathered coordinates and projections live in buffers reused block after block (scratch), which
    # stay in the core's cache; a flat index_select with a precomputed index measured no faster (its index's traffic)
    g = torch.gather(x, 2, index.expand(h, -1, -1), out=scratch("null_gather", (h, d, kn), x))  # [head, dim, perm*n]
    # numpy's BLAS on the CPU (qkplast.tensors.matmul): 1.3x torch's on these four-row products
    proj = matmul(delta, g, out=scratch("null_proj", (h, p, kn), x))  # [head, pair, perm*n]
    return proj.square_().view(h, p, kn // n, n).sum(-1).permute(2, 0, 1)  # [perm, head, pair]


def diagonal_ratios(buckets: list[DiagonalBucket], index: list[torch.Tensor], heads: slice) -> torch.Tensor:
    """``v_diag / v_full`` of every usable (bucket, pair) of the heads ``heads`` under each permutation.

    ``index[i]`` is bucket ``buckets[i]``'s :func:`gather_index`. Returns ``[perm, head, term]`` (the buckets'
    pairs one after another).
    """
    out = []
    for blk, idx in zip(buckets, index):
        e = permuted_energy(blk.x[heads], blk.delta[heads], idx)  # [perm, head, pair]
        out.append(blk.v_diag[heads] / (e / blk.n1 + blk.v1[heads]))  # v_full as _ratio_diag_full forms it
    return torch.cat(out, -1)


def diagonal_null(capture: xr.Dataset, n_perm: int = 1000, pairs_per_bucket: int = 4, seed: int = 0,
                  options: AnalysisOptions | None = None, perm_chunk: int = 8) -> xr.Dataset:
    """``v_diag / v_full`` against a within-bucket permutation of each semantic coordinate (see module doc).

    The spread statistic is ``log(q95 / q05)`` of the ratio over all (head,
    bucket, pair) terms; the null keeps every coordinate's variance, hence
    ``v_diag``, and recomputes ``v_full`` from the permuted queries
    (:func:`permuted_energy`, one block of heads at a time).
    """
    s = _Setup(capture, options, pairs_per_bucket, seed)
    gen = torch.Generator(device=s.dev).manual_seed(seed)
    var, sig = s.model.cov, s.model.sigma2_pos
    ok = s.ok[None].expand(s.delta.shape[:3])
    spread = "log_q95_over_q05"
    observed = _summary(_ratio_diag_full(s.delta, var, s.x, s.n, sig)[ok], spread)
    # all pairs (the same numbers as pair_statistics' v_diag / v_full)
    observed_all = _summary(s.all_pairs(lambda d, sl: _ratio_diag_full(d, var[sl], s.x[sl], s.n, sig[sl])), spread)
    h, _, m, dim = s.x.shape
    buckets = diagonal_buckets(s.x, s.delta, var, sig, s.n, s.ok)
    # draws chunk by chunk (perm_chunk), computed a batch of draw chunks at a time: one pass of the workers over the
    # heads per batch, not per chunk
    batch = perm_chunk * max(1, PERM_BATCH // perm_chunk)
    chunk = s.head_chunk(8 * (dim + pairs_per_bucket) * batch * m)  # gathered coordinates, projections
    null = []
    for b0 in range(0, n_perm, batch):
        drawn = [_bucket_permutations(s.qmask, min(perm_chunk, n_perm - p0), (dim,), gen, slot_last=True)
                 for p0 in range(b0, min(b0 + batch, n_perm), perm_chunk)]  # [perm, bucket, dim, n_max] each
        perm = torch.cat(drawn)
        index = [gather_index(perm[:, blk.bucket, 1:, : blk.x.shape[-1]]) for blk in buckets]  # [1, dim-1, perm*n]
        parts = map_head_chunks(lambda sl: diagonal_ratios(buckets, index, sl), h, chunk, s.dev)
        null.append(_summary(torch.cat(parts, 1).reshape(perm.shape[0], -1), spread))  # [perm, 4]
    return _result(observed, observed_all, torch.cat(null), "v_diag / v_full", spread, n_perm, pairs_per_bucket,
                   seed, "each rotated semantic coordinate permuted independently across the bucket's queries "
                         "(one permutation per bucket and coordinate, shared by all heads)")


# --------------------------------------------------------------------------- the bucket-shuffle null


def relabel_onehot(labels: torch.Tensor, n_bucket: int, dtype=torch.float64) -> torch.Tensor:
    """``[perm, bucket, sample]`` one-hot matrices of the relabellings ``labels`` ``[perm, sample]``."""
    k, n = labels.shape
    out = torch.zeros(k, n_bucket, n, dtype=dtype, device=labels.device)
    return out.scatter_(1, labels[:, None, :], 1.0)


def bucket_moments(onehot: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Each relabelled bucket's sums of ``features``: ``[head, perm, bucket, feature]``.

    ``onehot`` ``[perm, bucket, sample]`` (:func:`relabel_onehot`), ``features`` ``[head, sample, feature]``. One
    batched product: on the default run's bucket-shuffle null 14 s of CPU per 1000 permutations for the sums of
    ``x`` and ``x^2`` against 48 s for the former scatter (both beside other work on the 2-core machine).
    """
    k, b, n = onehot.shape
    return torch.matmul(onehot.reshape(k * b, n), features).view(features.shape[0], k, b, -1)


def bucket_spread(s1: torch.Tensor, s_a: torch.Tensor, d2: torch.Tensor, v1: torch.Tensor, count: torch.Tensor,
                  buckets: torch.Tensor) -> torch.Tensor:
    """Per head, the median over pairs of ``max_b v / min_b v`` with ``v`` eq. 4.12's variance of each pair, from
    each bucket's sums.

    ``v = sum_d d2_d var_bd + v1`` with ``var_bd = (S2_bd - S1_bd^2 / c_b) / (c_b - 1)``, and ``sum_d d2_d S2_bd``
    is the bucket's sum of the per-sample ``sum_d d2_d x_d^2`` (``s_a``): the sums of squares enter reduced over
    coordinates to one number per pair, before the permutations expand them.

    Parameters
    ----------
    s1 : torch.Tensor
        ``[head, perm, bucket, dim-1]`` each bucket's sums of the semantic coordinates.
    s_a : torch.Tensor
        ``[head, perm, bucket, pair]`` each bucket's sums of ``sum_d d2[p, d] x_d^2``.
    d2 : torch.Tensor
        ``[head, pair, dim-1]`` squared semantic key differences.
    v1 : torch.Tensor
        ``[head, pair]`` the positional term ``delta_1^2 sigma_pos^2``.
    count : torch.Tensor
        ``[bucket, 1]`` the buckets' sample counts (at least 2).
    buckets : torch.Tensor
        The positions of the buckets compared (long): an index, not a mask, so no replicate waits on the host
        to learn a mask's size.

    Returns
    -------
    torch.Tensor
        ``[head, perm]``.
    """
    h, k, b, d = s1.shape
    mean_part = torch.matmul((s1 * s1).view(h, k * b, d), d2.transpose(1, 2)).view(h, k, b, -1)  # sum_d d2 S1^2
    v = (s_a - mean_part / count) / (count - 1) + v1[:, None, None]  # [head, perm, bucket, pair]
    v = v.index_select(2, buckets)
    return (v.amax(-2) / v.amin(-2)).median(-1).values


def bucket_shuffle_null(capture: xr.Dataset, n_perm: int = 1000, pairs_per_bucket: int = 32, seed: int = 0,
                        options: AnalysisOptions | None = None, perm_chunk: int = 25) -> xr.Dataset:
    """Per head, the median over the last bucket's pairs of ``max_b v / min_b v``; bucket labels shuffled
    within documents.

    ``v`` is the options' diagonal variance (eq. 4.12) of the last bucket's
    key pairs evaluated with each bucket's statistics (as
    :func:`qkplast.theory.checks.variance_across_buckets`). The reported summary is
    over heads; the spread statistic is the median over heads. The relabelled buckets' moments come from
    :func:`bucket_moments`, one block of heads at a time.
    """
    s = _Setup(capture, options, pairs_per_bucket, seed)
    gen = torch.Generator(device=s.dev).manual_seed(seed)
    lay, qr = s.lay, s.qr
    last = s.sub_ok[-1]
    delta = s.delta[:, -1][:, last]  # [head, pair, dim]
    d2 = delta * delta
    sig = s.model.sigma2_pos

    def per_head(var_sem):  # var_sem [..., head, bucket, dim-1] -> [..., head]
        v = torch.einsum("hpd,...hbd->...hbp", d2[..., 1:], var_sem) + (d2[..., 0] * sig[:, None])[:, None]
        v = v[..., s.ok_bucket, :]
        return (v.amax(-2) / v.amin(-2)).median(-1).values

    bucket = torch.as_tensor(capture["bucket"].values, device=s.dev)
    _, doc = np.unique(capture["doc"].values, return_inverse=True)
    doc = torch.as_tensor(doc, device=s.dev, dtype=torch.float64)
    n_bucket = len(lay.buckets)
    sem = qr[..., 1:]  # [head, sample, dim-1]
    d2_sem, v1 = d2[..., 1:].contiguous(), d2[..., 0] * sig[:, None]  # [head, pair, dim-1], [head, pair]
    # per sample, x and sum_d d2_d x_d^2 of every pair: one product gives each relabelled bucket's sums of both
    features = torch.cat([sem, torch.matmul(sem * sem, d2_sem.transpose(1, 2))], -1)  # [head, sample, dim-1 + pair]
    cnt = torch.as_tensor(lay.counts, device=s.dev, dtype=sem.dtype).clamp_min(2)[:, None]  # [bucket, 1]
    compared = torch.nonzero(s.ok_bucket).flatten()  # [bucket'] the buckets with enough queries

    def block(sl, onehot):  # the null statistic of the heads sl under every relabelling: [head, perm]
        m = bucket_moments(onehot, features[sl])  # [head, perm, bucket, dim-1 + pair]
        return bucket_spread(m[..., : sem.shape[-1]], m[..., sem.shape[-1]:], d2_sem[sl], v1[sl], cnt, compared)

    observed = per_head(s.model.cov[..., 1:])
    d_all = s.bucket_delta_all(-1)[:, s.valid_all[-1]]  # [head, pair, dim]
    v_all = torch.einsum("hpd,hbd->hbp", d_all * d_all, s.model.cov)[:, s.ok_bucket]
    observed_all = (v_all.amax(1) / v_all.amin(1)).median(-1).values
    spread = "median_over_heads"
    null = []
    order = torch.argsort(doc, stable=True)  # samples grouped by document
    chunk = s.head_chunk(8 * perm_chunk * n_bucket * (sem.shape[-1] + 3 * d2.shape[1]))
    for p0 in range(0, n_perm, perm_chunk):
        pc = min(perm_chunk, n_perm - p0)
        keys = doc[None] + torch.rand((pc, doc.numel()), generator=gen, dtype=torch.float64, device=s.dev)
        shuffled = torch.argsort(keys, dim=1)  # each document's samples in a random order, documents in order
        labels = torch.empty((pc, doc.numel()), dtype=torch.long, device=s.dev)
        labels[:, order] = bucket[shuffled]  # the i-th sample of a document takes the label of a random one
        onehot = relabel_onehot(labels, n_bucket)  # [perm, bucket, sample]
        parts = map_head_chunks(lambda sl: block(sl, onehot), qr.shape[0], chunk, s.dev)
        null.append(_summary(torch.cat(parts).T, spread))  # [perm, 4]
    return _result(_summary(observed, spread), _summary(observed_all, spread), torch.cat(null),
                   "per head: median over the last bucket's pairs of max_b v / min_b v", spread, n_perm,
                   pairs_per_bucket, seed, "bucket labels permuted among the samples of each document")


# --------------------------------------------------------------------------- the independence null


def cross_terms(x1: torch.Tensor, proj: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``sum_m x1[h, b, perm[k, b, m]] proj[h, b, m, p]``: coordinate 1 permuted against the fixed semantic
    projections.

    Parameters
    ----------
    x1 : torch.Tensor
        ``[head, bucket, n_max]`` centred coordinate 1 (padding zero).
    proj : torch.Tensor
        ``[head, bucket, n_max, pair]`` semantic score deviations.
    perm : torch.Tensor
        ``[perm, bucket, n_max]`` permutations of each bucket's slots (padding in place), shared by every head.

    Returns
    -------
    torch.Tensor
        ``[head, bucket, perm, pair]``.
    """
    k, b, m = perm.shape
    h = x1.shape[0]
    idx = perm.transpose(0, 1).reshape(1, b, k * m)  # [1, bucket, perm*n_max]
    x1p = torch.gather(x1, 2, idx.expand(h, -1, -1), out=scratch("null_x1", (h, b, k * m), x1))
    return torch.matmul(x1p.view(h, b, k, m), proj)  # [head, bucket, perm, pair]


def independence_null(capture: xr.Dataset, n_perm: int = 1000, pairs_per_bucket: int = 32, seed: int = 0,
                      options: AnalysisOptions | None = None, perm_chunk: int = 50) -> xr.Dataset:
    """``v_joint / v_indep`` against a within-bucket permutation of rotated coordinate 1 (see module doc).

    With the bucket's own moments of all d coordinates, ``v_joint = v_indep +
    2 delta_1 sum_e Cov(x_1, x_e) delta_e``; permuting coordinate 1 changes only
    that cross term (:func:`cross_terms`). Spread statistic: ``log(q95 / q05)`` over all terms.
    """
    s = _Setup(capture, options, pairs_per_bucket, seed, positional_fit="per_bucket")
    gen = torch.Generator(device=s.dev).manual_seed(seed)
    n1 = (s.n - 1)[None, :, None]
    ok = s.ok[None].expand(s.delta.shape[:3])

    def parts(delta, x):
        proj = torch.einsum("hbmd,hbpd->hbmp", x[..., 1:], delta[..., 1:])  # [head, bucket, n_max, pair]
        v_indep = (proj * proj).sum(2) / n1 + delta[..., 0] ** 2 * ((x[..., 0] ** 2).sum(2) / (s.n - 1))[..., None]
        return proj, v_indep

    proj, v_indep = parts(s.delta, s.x)
    x1 = s.x[..., 0]  # [head, bucket, n_max]

    def ratio(x1p):  # x1p [..., head, bucket, n_max]
        cross = torch.einsum("...hbm,hbmp->...hbp", x1p, proj) / n1
        return (v_indep + 2 * s.delta[..., 0] * cross) / v_indep

    spread = "log_q95_over_q05"
    observed = _summary(ratio(x1)[ok], spread)

    def ratio_all(delta, sl):  # every drawn pair of the heads sl: [head, bucket, pair]
        proj_all, v_indep_all = parts(delta, s.x[sl])
        cross_all = torch.einsum("hbm,hbmp->hbp", x1[sl], proj_all) / n1
        return (v_indep_all + 2 * delta[..., 0] * cross_all) / v_indep_all

    observed_all = _summary(s.all_pairs(ratio_all), spread)
    h, b, m = x1.shape
    x1 = x1.contiguous()
    nb1 = (s.n - 1)[None, :, None, None]  # [1, bucket, 1, 1]
    two_d1 = (2 * s.delta[..., 0])[:, :, None]  # [head, bucket, 1, pair]
    vi = v_indep[:, :, None]  # [head, bucket, 1, pair]
    terms = torch.nonzero(s.ok.reshape(-1)).flatten()  # [term] the usable (bucket, pair) of every head, row-major

    def block(sl, perm):  # [perm, head, term] ratios of the heads sl, as ratio() forms them
        cross = cross_terms(x1[sl], proj[sl], perm) / nb1  # [head, bucket, perm, pair]
        r = (vi[sl] + two_d1[sl] * cross) / vi[sl]
        return r.permute(2, 0, 1, 3).reshape(r.shape[2], r.shape[0], -1).index_select(2, terms)  # [perm, head, term]

    chunk = s.head_chunk(8 * perm_chunk * b * (m + 3 * proj.shape[-1]))
    null = []
    for p0 in range(0, n_perm, perm_chunk):
        pc = min(perm_chunk, n_perm - p0)
        perm = _bucket_permutations(s.qmask, pc, (), gen)  # [perm, bucket, n_max]
        parts_ = map_head_chunks(lambda sl: block(sl, perm), h, chunk, s.dev)
        null.append(_summary(torch.cat(parts_, 1).reshape(pc, -1), spread))
    return _result(observed, observed_all, torch.cat(null), "v_joint / v_indep", spread, n_perm, pairs_per_bucket,
                   seed, "rotated coordinate 1 permuted across the bucket's queries (one permutation per bucket, "
                         "shared by all heads)")


def null_table(results: dict[str, xr.Dataset]):
    """One row per null: observed median and 5-95% range, the null's, and the p-value, as text."""
    import pandas as pd

    rows = {}
    for name, r in results.items():
        o, nm = r.observed.values, r.null_median.values
        rows[name] = {
            "observed median": f"{o[0]:.3g}", "observed 5-95%": f"{o[1]:.3g}-{o[2]:.3g}",
            "null median": f"{nm[0]:.3g}", "null 5-95% (median over permutations)": f"{nm[1]:.3g}-{nm[2]:.3g}",
            "spread statistic": f"{r.attrs['spread_statistic']}: {o[3]:.3g} vs null {nm[3]:.3g} "
                                f"[{float(r.null_q05[3]):.3g}, {float(r.null_q95[3]):.3g}]",
            "p-value": f"{float(r.p_value):.3g}", "permutations": r.attrs["n_perm"],
        }
    return pd.DataFrame.from_dict(rows, orient="index")


def summary_line(result: xr.Dataset, label: str) -> str:
    """``label``: the observed median and 5-95% range beside the null's (median over permutations), in words."""
    o, nm = result.observed, result.null_median
    return (f"{label}: observed median {float(o.sel(summary='median')):.2f}, 5-95% {float(o.sel(summary='q05')):.2f}-"
            f"{float(o.sel(summary='q95')):.2f}; under the null median {float(nm.sel(summary='median')):.2f}, 5-95% "
            f"{float(nm.sel(summary='q05')):.2f}-{float(nm.sel(summary='q95')):.2f} "
            f"({result.attrs['pairs_per_bucket']} pairs per bucket)")


def describe(result: xr.Dataset, label: str, null_name: str):
    """The verdict on the spread statistic (:func:`qkplast.stats.decision.null_verdict`), two lines of text and the table.

    Returns ``(verdict, text, table)``: ``verdict["word"]`` is "confirmed" only when the observed spread
    beats the null; ``text`` is :func:`summary_line` and the spread statistic's verdict in words.
    """

    v = null_verdict(float(result.observed.sel(summary="spread")), result.null.sel(summary="spread").values,
                     null_name=null_name)
    text = f"{summary_line(result, label)}\nspread statistic {result.attrs['spread_statistic']}: {v['text']}"
    return v, text, null_table({label: result})


def off_axis_null(capture: xr.Dataset, n_perm: int = 1000, seed: int = 0, chunk: int = 50) -> dict:
    """The off-axis part of the key-position slope, ``mean_h (key_position_slope - bias_strength)``, against a
    position shuffle (corrections page, item 9).

    ``key_position_slope = mu_Q^T beta_K`` and ``bias_strength = (a^T mu_Q)(a^T beta_K)`` (eqs. 4.3-4.6), so their
    difference is ``mu_Q^T P beta_K``, the part of the slope off the drift axis ``a``; the null shuffles the
    token positions across samples (:func:`qkplast.stats.shuffles.position_shuffle_null`).

    Returns ``dict(observed, null)`` with ``null`` the ``n_perm`` values of the statistic.
    """

    return position_shuffle_null(capture, off_axis_slope, n_perm, seed, chunk)


# --------------------------------------------------------------------------- a targeted statistic against random sets


def rank_p(target: float, null, alternative: str = "greater") -> float:
    """One-sided rank p-value of ``target`` among ``n`` exchangeable null replicates: ``(1 + #{null at least as far in
    the claimed direction}) / (1 + n)``; its floor is ``1 / (1 + n)`` whatever the effect."""
    null = np.asarray(null, np.float64).ravel()
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less', got {alternative!r}")
    hits = null >= target if alternative == "greater" else null <= target
    return (1 + int(hits.sum())) / (1 + null.size)


def null_tail_test(target: float, null, window_contrast=None, *, alternative: str = "greater",
                   level: float = 0.95) -> dict:
    """A targeted statistic against ``n`` random-set replicates of it, by a parametric tail.

    Under exchangeable normal replicates the targeted value and the null mean differ by
    ``sd_null * sqrt(1 + 1/n)`` in standard deviation, and ``(target - mean) / (sd_null sqrt(1 + 1/n))`` follows
    Student's t with ``n - 1`` degrees of freedom exactly (a prediction interval turned into a test): unlike the
    rank p, its p-value has no floor at ``1 / (1 + n)``. When the statistic is a mean over windows (documents),
    ``window_contrast`` holds the per-window contrast (targeted minus null mean on each window); its spread,
    ``s_w^2 / n_w``, is added to the variance, so the test speaks of other documents too, and the degrees of
    freedom are Welch-Satterthwaite's.

    Parameters
    ----------
    target : float
        The targeted condition's statistic.
    null : array_like
        The statistic of each null replicate, ``[n]`` (``n >= 2``).
    window_contrast : array_like, optional
        ``[n_w]`` per-window contrasts (``n_w >= 2``); None: the null's spread alone.
    alternative : {"greater", "less"}
        The claimed direction, of ``p_one`` and of the rank p.
    level : float
        Confidence level of the two-sided interval on the contrast.

    Returns
    -------
    dict
        ``estimate`` (target minus the null mean), ``se``, ``df``, ``t``, ``p`` (two-sided, as
        :func:`qkplast.stats.decision.verdict` takes it, so that a contrast on the other side can be
        "contradicted"), ``p_one`` (one-sided in the claimed direction), ``lo``/``hi``, ``p_rank`` (:func:`rank_p`,
        one-sided), ``floor`` (``1 / (1 + n)``) and ``n_null``.
    """
    from scipy import stats

    null = np.asarray(null, np.float64).ravel()
    null = null[np.isfinite(null)]
    if null.size < 2 or not np.isfinite(target):
        raise ValueError(f"the tail test needs a finite target and at least two finite null replicates, got "
                         f"{null.size}")
    n = null.size
    v_set = np.var(null, ddof=1) * (1 + 1 / n)
    terms = [(v_set, n - 1)]  # (variance component, its degrees of freedom)
    if window_contrast is not None:
        w = np.asarray(window_contrast, np.float64).ravel()
        w = w[np.isfinite(w)]
        if w.size < 2:
            raise ValueError(f"the windows' spread needs at least two windows, got {w.size}")
        terms.append((np.var(w, ddof=1) / w.size, w.size - 1))
    var = sum(v for v, _ in terms)
    df = var**2 / sum(v**2 / d for v, d in terms) if var > 0 else float(n - 1)  # Welch-Satterthwaite
    se = float(np.sqrt(var))
    est = float(target - null.mean())
    t = est / se if se > 0 else np.copysign(np.inf, est) if est else 0.0
    p_one = float(stats.t.sf(t, df) if alternative == "greater" else stats.t.cdf(t, df))
    p = float(min(1.0, 2 * stats.t.sf(abs(t), df)))
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return {"estimate": est, "se": se, "df": float(df), "t": float(t), "p": p, "p_one": p_one, "lo": est - half,
            "hi": est + half,
            "p_rank": rank_p(target, null, alternative), "floor": 1 / (1 + n), "n_null": int(n)}


def tail_detectable(se: float, df: float, alpha: float, power: float = 0.8) -> float:
    """Smallest contrast :func:`null_tail_test`'s two-sided p detects with ``power`` at level ``alpha``, in the
    contrast's units: ``se`` times the noncentrality at which the noncentral t with ``df`` degrees of freedom
    (rounded down, so never optimistic) exceeds the critical values with that probability
    (:func:`qkplast.stats.power.detectable_effect` over ``df + 1`` units, rescaled from units to the mean)."""
    from qkplast.stats.power import detectable_effect

    units = max(2, int(np.floor(df)) + 1)
    return float(se * np.sqrt(units) * detectable_effect(units, alpha, power, alternative="two-sided"))


def tail_calibration(n_null: int, n_windows: int | None = None, alphas=(0.01, 0.05, 0.1), reps: int = 20000,
                     seed: int = 0) -> dict:
    """Rejection rates of :func:`null_tail_test` on a planted null: the targeted set exchangeable with the others.

    Each replicate draws ``n_null + 1`` sets; the first is the "targeted" one. Without ``n_windows`` each set's
    statistic is one standard normal; with it, each set is measured on ``n_windows`` windows that share a window
    effect (``N(0, 1)`` per window, plus ``N(0, 1)`` per set and window), the statistic being the mean over windows,
    and the per-window contrast enters the test as in the chapter. Returns the fractions of replicates with the tail's
    two-sided p below each alpha (``"tail"``; ``"tail_one"`` one-sided, "greater") beside the same fraction for the
    one-sided rank p (``"rank"``), whose floor makes it 0 for ``alpha < 1 / (1 + n_null)``.
    """
    from scipy import stats

    rng = np.random.default_rng(seed)
    n = int(n_null)
    if n_windows is None:
        x = rng.normal(size=(reps, n + 1))  # [rep, set]
        stat, wc = x, None
    else:
        x = rng.normal(size=(reps, 1, n_windows)) + rng.normal(size=(reps, n + 1, n_windows))  # [rep, set, window]
        stat = x.mean(-1)
        wc = x[:, 0] - x[:, 1:].mean(1)  # [rep, window]
    target, null = stat[:, 0], stat[:, 1:]
    v = null.var(1, ddof=1) * (1 + 1 / n)  # [rep]: vectorised null_tail_test
    if wc is None:
        df = np.full(reps, n - 1.0)
    else:
        vw = wc.var(1, ddof=1) / n_windows
        df = (v + vw) ** 2 / (v**2 / (n - 1) + vw**2 / (n_windows - 1))
        v = v + vw
    t = (target - null.mean(1)) / np.sqrt(v)
    p_one, p = stats.t.sf(t, df), 2 * stats.t.sf(np.abs(t), df)
    rank = (1 + (null >= target[:, None]).sum(1)) / (1 + n)
    return {"alpha": list(alphas), "tail": [float((p < a).mean()) for a in alphas],
            "tail_one": [float((p_one < a).mean()) for a in alphas],
            "rank": [float((rank < a).mean()) for a in alphas], "reps": reps, "n_null": n, "n_windows": n_windows}

"""Many cuts of one capture analysed at once: replicates batched over a leading axis.

A jackknife over documents re-analyses a capture with documents left out; the reseeded null of the content-decay
conditions re-analyses the capture at every position cut at the positions other seeds sample. Each of those is a
*cut* of one capture: a subset of its samples, every head kept, analysed as a capture of its own (its own moments,
Householder basis, query model and key pairs). This module analyses many cuts in one batched pass instead of a
Python loop of whole analyses:

- :func:`cut_plan`: what every head shares in each cut (:class:`CutPlan`): the cut's samples, padded to the
  largest cut, their positions and buckets, and its key pairs and pair weights exactly as
  :func:`qkplast.analysis.pairs.pair_plan` gives them for the cut alone. Building it is a Python loop over the
  cuts of index bookkeeping only: the pairs are drawn by :func:`qkplast.analysis.pairs.sample_key_pairs` from
  the cut's own samples (the same generator and seed as a capture of its own), or are given (a jackknife's share
  of a larger draw, :func:`qkplast.analysis.pairs.pairs_without`);
- :func:`gather_units`: the vectors of a batch of *units* ``(cut, query head, key head)`` (a unit's queries and
  keys come from two heads for the GQA null of :mod:`qkplast.analysis.gqa`, from one otherwise) as
  ``[unit, sample, dim]`` tensors, padding rows zero;
- :func:`unit_clouds`: each unit's moments, Householder basis (eq. 4.10) and diagonal query model (eqs.
  4.11-4.12) as the per-capture analysis computes them for the cut (:class:`UnitClouds`);
- :func:`counterfactual_pair_profiles`: the closed form of the four counterfactual models of
  :mod:`qkplast.analysis.decompose`, averaged over each bucket's pairs with the estimator's weights
  ``[unit, bucket, variant]``;
- :func:`rotated_models` and :func:`shared_key_profiles`: the closed form of the fitted model for query units that
  share their keys (every query head of a GQA layer against one key head, :mod:`qkplast.analysis.gqa`), the pair
  differences formed once per key head in the captured basis and read for every query head at once;
- :func:`map_units`: the units in chunks (``[unit, sample, dim]`` temporaries of a few dozen megabytes on the CPU,
  about 1 GB on a GPU), spread over the cores as :func:`qkplast.tensors.map_head_chunks` spreads heads.

Every kernel is torch and device-agnostic (on a GPU a chunk is one block; its only synchronisation is the check,
after the chunk's passes, for the rare pairs whose variance is recomputed in its exact form); the padded samples
carry zero weight in every sum, so a unit's values are those of its cut analysed alone, up to the order of
floating-point sums (the unit tests compare the two cut by cut, to 1e-12 relative). Only the options of the thesis's default model are
batched (:func:`supports`): a diagonal covariance, per-bucket semantic statistics and the global positional fit;
callers fall back to a loop of per-cut analyses for the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr

from qkplast.analysis.linalg import householder_apply, householder_vector
from qkplast.analysis.pairs import KeyPairs, bucket_positions, pair_weights, sample_key_pairs
from qkplast.analysis.plasticity import QueryModel, pairwise_plasticity, weighted_pair_mean
from qkplast.options import AnalysisOptions
from qkplast.tensors import SCRATCH_CPU_MB, auto_chunk, head_chunks, map_head_chunks, matmul, scratch

__all__ = ["CutPlan", "UnitClouds", "counterfactual_pair_profiles", "cut_plan",
           "gather_rows", "gather_units", "keeps_of", "map_units", "padded_source", "pair_means", "rotated_models",
           "sample_view", "shared_key_profiles", "supports", "unit_clouds", "unit_chunk"]

#: bytes of one block of pair differences on the CPU (:data:`qkplast.analysis.plasticity.PAIR_BLOCK_CPU_BYTES`'s
#: reasoning: the passes over a block find it in cache)
PAIR_BLOCK_CPU_BYTES = 4 * 2**20


def supports(options: AnalysisOptions) -> bool:
    """Whether the batched kernels reproduce the per-cut analysis under these options (the thesis's model:
    diagonal covariance, per-bucket semantic statistics, global positional fit; any pair rule, weights, edges)."""
    return (options.covariance, options.semantic_stats, options.positional_fit) == ("diagonal", "per_bucket", "global")


# --------------------------------------------------------------------------- the cuts' shared layout


def sample_view(capture: xr.Dataset) -> xr.Dataset:
    """The capture without its vectors: the per-sample coordinates and the attributes (cheap to cut)."""
    return xr.Dataset(coords={name: capture[name] for name in ("position", "bucket", "doc")}, attrs=capture.attrs)


def keeps_of(capture: xr.Dataset, cuts) -> np.ndarray:
    """Boolean sample masks ``[cut, sample]`` from masks or index arrays, one per cut."""
    n = capture.sizes["sample"]
    out = np.zeros((len(cuts), n), dtype=bool)
    for c, cut in enumerate(cuts):
        cut = np.asarray(cut)
        if cut.dtype == bool:
            if cut.shape != (n,):
                raise ValueError(f"a boolean cut must have one entry per sample ({n}), got {cut.shape}")
            out[c] = cut
        else:
            out[c, cut] = True
    return out


@dataclass
class CutPlan:
    """What every head shares in each cut (one row per cut), padded to the largest cut.

    Indices of pairs and of samples are into each cut's own samples, in the capture's order (the order a cut
    ``capture.isel(sample=np.flatnonzero(keep))`` has), so they are those of :func:`qkplast.analysis.pairs.pair_plan`
    on the cut.
    """

    samples: torch.Tensor  # [cut, n] indices into the capture's samples (padding: one past the last)
    present: torch.Tensor  # [cut, n] float64: 1 for a sample of the cut, 0 for padding
    n: torch.Tensor  # [cut] samples of each cut (float64)
    t: torch.Tensor  # [cut, n] positions (float64, 0 at padding)
    bucket: torch.Tensor  # [cut, n] bucket of each sample (padding: n_bucket, a bucket no statistic reads)
    counts: torch.Tensor  # [cut, bucket] queries per bucket (float64)
    usable: torch.Tensor  # [cut, bucket] the counts of buckets with statistics, 0 for the others (float64)
    tau: torch.Tensor  # [cut, bucket] representative positions
    pair_buckets: np.ndarray  # [pair_bucket] the buckets the pair tensors hold (those with a weighted pair)
    pi: torch.Tensor  # [cut, pair_bucket, pair] first key of each pair (an index into the cut's samples)
    pj: torch.Tensor  # [cut, pair_bucket, pair]
    pweight: torch.Tensor  # [cut, pair_bucket, pair] weight in the bucket's mean; 0 where not valid (float64)
    buckets: np.ndarray  # [bucket]
    pairs: list  # KeyPairs of each cut (over every bucket)

    @property
    def n_cut(self) -> int:
        return self.samples.shape[0]

    @property
    def n_bucket(self) -> int:
        return len(self.buckets)


def cut_plan(capture: xr.Dataset, keeps: np.ndarray, opt: AnalysisOptions, dev: torch.device,
             pairs: list[KeyPairs] | None = None, pair_buckets=None) -> CutPlan:
    """The shared layout of each cut ``keeps`` ``[cut, sample]`` of ``capture`` (see :class:`CutPlan`).

    Parameters
    ----------
    pairs : list of KeyPairs or None, optional
        Each cut's key pairs (indices into the cut's samples); default (or None in the list): drawn by
        :func:`qkplast.analysis.pairs.sample_key_pairs` on the cut, as an analysis of the cut alone draws them.
    pair_buckets : array of int, optional
        The buckets whose pairs the kernels evaluate (default: all); of those, the buckets where no cut has a pair
        with weight are left out (their plasticity is NaN, :attr:`CutPlan.pair_buckets` names the others).

    A Python loop over the cuts of index bookkeeping (positions, counts, the pairs' draw); no vector is read.
    """
    view = sample_view(capture)
    keeps = np.asarray(keeps, dtype=bool)
    n_cut = keeps.shape[0]
    buckets, _, _, _ = bucket_positions(view, opt.query_position)
    n_bucket = len(buckets)
    pair_buckets = np.arange(n_bucket) if pair_buckets is None else np.asarray(pair_buckets, dtype=np.int64)
    sizes = keeps.sum(1)
    n_max = max(int(sizes.max()), 1)
    samples = np.full((n_cut, n_max), capture.sizes["sample"], dtype=np.int64)  # padding: the zero row
    present = np.zeros((n_cut, n_max))
    t = np.zeros((n_cut, n_max))
    bucket = np.full((n_cut, n_max), n_bucket, dtype=np.int64)
    counts = np.zeros((n_cut, n_bucket))
    tau = np.zeros((n_cut, n_bucket))
    pi = np.zeros((n_cut, len(pair_buckets), opt.n_pairs), dtype=np.int64)
    pj = np.zeros_like(pi)
    pweight = np.zeros(pi.shape)
    position, sample_bucket = capture["position"].values, capture["bucket"].values
    drawn = []
    for c in range(n_cut):  # cuts only: index bookkeeping, no vectors
        idx = np.flatnonzero(keeps[c])
        cut = view.isel(sample=idx)
        _, tau_c, _, counts_c = bucket_positions(cut, opt.query_position)
        kp = sample_key_pairs(cut, opt) if pairs is None or pairs[c] is None else pairs[c]
        if kp.i.shape != (n_bucket, opt.n_pairs):
            raise ValueError(f"cut {c}: pairs of shape {kp.i.shape}, expected {(n_bucket, opt.n_pairs)}")
        few = (counts_c < opt.min_bucket_samples) | (counts_c == 0)
        valid = kp.valid & ~few[:, None]  # pair_plan's pvalid
        weight = np.where(valid, pair_weights(kp, position[idx], opt.pair_weight), 0.0)
        m = len(idx)
        samples[c, :m], present[c, :m], t[c, :m], bucket[c, :m] = idx, 1.0, position[idx], sample_bucket[idx]
        counts[c], tau[c] = counts_c, tau_c
        pi[c], pj[c], pweight[c] = kp.i[pair_buckets], kp.j[pair_buckets], weight[pair_buckets]
        drawn.append(kp)
    usable = np.where((counts >= opt.min_bucket_samples) & (counts > 0), counts, 0.0)
    # a bucket no cut has a weighted pair in has no plasticity (NaN): its pairs are not evaluated at all
    weighted = pweight.any(axis=(0, 2))  # [pair_bucket]
    pair_buckets, pi, pj, pweight = pair_buckets[weighted], pi[:, weighted], pj[:, weighted], pweight[:, weighted]
    f64 = lambda x: torch.as_tensor(x, dtype=torch.float64, device=dev)  # noqa: E731
    i64 = lambda x: torch.as_tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    return CutPlan(i64(samples), f64(present), f64(sizes.astype(float)), f64(t), i64(bucket), f64(counts), f64(usable),
                   f64(tau), pair_buckets, i64(pi), i64(pj), f64(pweight), buckets, drawn)


# --------------------------------------------------------------------------- units: (cut, query head, key head)


def padded_source(x, device: torch.device) -> torch.Tensor:
    """A capture's vectors ``[head, sample, dim]`` as float64 on ``device`` with one zero row appended per head
    ``[head, sample + 1, dim]``: the row every padding slot of a cut gathers (:attr:`CutPlan.samples`), so gathered
    clouds are zero at their padding without a pass to mask them."""
    x = torch.as_tensor(np.asarray(x), device=device)
    out = torch.empty(x.shape[0], x.shape[1] + 1, x.shape[-1], dtype=torch.float64, device=device)
    out[:, -1] = 0.0
    out[:, :-1].copy_(x)  # converted in the copy: one pass over the capture
    return out


def gather_rows(x: torch.Tensor, plan: CutPlan, cut: torch.Tensor, head: torch.Tensor, name: str) -> torch.Tensor:
    """The vectors ``[unit, n, dim]`` of head ``head[u]`` at the samples of cut ``cut[u]`` from ``x``
    ``[head, sample + 1, dim]`` (:func:`padded_source`; padding rows zero), in a per-thread scratch buffer."""
    h, s, d = x.shape
    samples = plan.samples[cut]  # [unit, n]
    return torch.index_select(x.reshape(h * s, d), 0, (head[:, None] * s + samples).reshape(-1),
                              out=scratch(name, (samples.numel(), d), x)).view(*samples.shape, d)


def gather_units(q: torch.Tensor, k: torch.Tensor, plan: CutPlan, cut: torch.Tensor, q_head: torch.Tensor,
                 k_head: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each unit's queries and keys ``[unit, n, dim]`` (float64, padding rows zero; per-thread scratch buffers).

    ``q``, ``k`` ``[head, sample + 1, dim]`` are the capture's vectors from :func:`padded_source`; unit ``u``
    takes the queries of head ``q_head[u]`` and the keys of head ``k_head[u]`` at the samples of cut ``cut[u]``.
    """
    return gather_rows(q, plan, cut, q_head, "cut_q"), gather_rows(k, plan, cut, k_head, "cut_k")


@dataclass
class UnitClouds:
    """Each unit's Householder basis and query model (eqs. 4.10-4.12), as the analysis of its cut alone gives them.

    ``kr`` ``[unit, n, dim]`` are the rotated keys (centred or not, see :func:`unit_clouds`; padding rows zero),
    in a per-thread scratch buffer; ``model`` the diagonal query model ``[unit, bucket, dim]``; ``key_slope``
    ``[unit, dim]`` is ``H beta_K``.
    """

    u: torch.Tensor
    kr: torch.Tensor
    model: QueryModel
    key_slope: torch.Tensor


def _masked_slope(x: torch.Tensor, t: torch.Tensor, present: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """:func:`qkplast.analysis.moments.slope` of ``x`` ``[unit, n, dim]`` (zero at padding) on ``t`` ``[unit, n]``
    over each unit's present samples: ``sum (x - x_bar)(t - t_bar) / sum (t - t_bar)^2`` ``[unit, dim]``."""
    xc = torch.addcmul(x, present[..., None], (x.sum(1) / n[:, None])[:, None, :], value=-1.0)  # [unit, n, dim]
    tc = (t - (t * present).sum(1, keepdim=True) / n[:, None]) * present  # [unit, n]
    return torch.bmm(tc[:, None, :], xc)[:, 0] / (tc * tc).sum(-1, keepdim=True)


def unit_clouds(q: torch.Tensor, k: torch.Tensor, plan: CutPlan, cut: torch.Tensor,
                centred_keys: bool = True) -> UnitClouds:
    """Householder basis, rotated keys and diagonal query model of each unit (eqs. 4.10-4.12), under the options
    :func:`supports` (the model's other options are the plan's: buckets, positions).

    Parameters
    ----------
    q, k : Tensor ``[unit, n, dim]``
        float64, padding rows zero (:func:`gather_units`); ``k`` is overwritten (it becomes ``kr``). ``k`` None
        (with ``centred_keys`` False): the queries' basis and model alone, ``kr`` None.
    cut : Tensor ``[unit]``
        The cut of each unit (rows of ``plan``).
    centred_keys : bool
        True: the drift from the centred clouds and the keys centred before the rotation, as
        :func:`qkplast.analysis.moments.cloud_moments` and :func:`qkplast.analysis.plasticity.rotated_clouds` (the
        AP_drop decomposition); False: the drift from :func:`qkplast.analysis.moments.slope` and the keys rotated as
        they are, as :func:`qkplast.analysis.plasticity.closed_form` (the GQA cross profiles). Differences of keys
        are the same either way, to rounding.

    Notes
    -----
    Padding rows take no part in any sum: they are zero where a sum runs over samples, and the per-bucket sums
    put them in a bucket past the last, which is dropped. The queries are rotated as captured, ``H q``, where
    :func:`rotated_clouds` rotates the centred queries with their mean added back (the same vectors to rounding).
    """
    present, n, t = plan.present[cut], plan.n[cut], plan.t[cut]  # [unit, n], [unit], [unit, n]
    n_unit, n_bucket, dim = q.shape[0], plan.n_bucket, q.shape[-1]
    if centred_keys:  # cloud_moments: the drift from the centred clouds' cross sums with position
        tc = (t - (t * present).sum(1, keepdim=True) / n[:, None]) * present  # [unit, n] t - t_bar, 0 at padding
        stt = (tc * tc).sum(-1)  # [unit]
        centred = lambda x: torch.addcmul(x, present[..., None], (x.sum(1) / n[:, None])[:, None, :],  # noqa: E731
                                          value=-1.0, out=scratch("cut_centred", tuple(x.shape), x))
        beta = torch.bmm(tc[:, None, :], centred(q))[:, 0] / stt[:, None]  # [unit, dim] query drift
        kc = torch.addcmul(k, present[..., None], (k.sum(1) / n[:, None])[:, None, :], value=-1.0, out=k)
        cross_k = torch.bmm(tc[:, None, :], kc)[:, 0]  # [unit, dim]
    else:  # plasticity.rotate: the drift by slope(), the keys as captured
        beta = _masked_slope(q, t, present, n)
        kc = k
    if (torch.linalg.vector_norm(beta, dim=-1) == 0).any():
        raise ValueError("a head has zero query drift (beta = 0): the Householder direction is undefined")
    u = householder_vector(beta)  # [unit, dim], eq. 4.10
    qr = householder_apply(u, q, out=scratch("cut_rotated_q", tuple(q.shape), q))  # [unit, n, dim], 0 at padding
    kr = householder_apply(u, kc, out=kc) if kc is not None else None
    key_slope = (householder_apply(u, (cross_k / stt[:, None])[:, None, :])[:, 0] if centred_keys
                 else torch.zeros_like(beta))  # [unit, dim] H beta_K (the closed form alone does not read it)
    # the query model of query_model(): per-bucket means and diagonal variances (two-pass), segment sums in sample
    # order over the flattened (unit, bucket) cells; padding goes to a cell past each unit's last bucket
    cell = (torch.arange(n_unit, device=q.device)[:, None] * (n_bucket + 1) + plan.bucket[cut]).reshape(-1)
    rows = qr.reshape(-1, dim)  # [unit * n, dim]
    sums = rows.new_zeros(n_unit * (n_bucket + 1), dim).index_add_(0, cell, rows)
    nb = plan.counts[cut]  # [unit, bucket]
    mean_b = sums.view(n_unit, n_bucket + 1, dim)[:, :n_bucket] / nb.clamp_min(1)[..., None]  # [unit, bucket, dim]
    means = torch.cat([mean_b, mean_b.new_zeros(n_unit, 1, dim)], 1).view(-1, dim)
    resid = torch.index_select(means, 0, cell, out=scratch("cut_residuals", tuple(rows.shape), rows))
    resid = torch.sub(rows, resid, out=resid)
    cov_b = sums.zero_().index_add_(0, cell, resid.mul_(resid)).view(n_unit, n_bucket + 1, dim)[:, :n_bucket]
    cov_b = cov_b / (nb - 1).clamp_min(1)[..., None]
    # coordinate 1: the global linear fit in position (eq. 4.11)
    q1 = qr[..., 0]  # [unit, n]
    beta_pos = _masked_slope(q1[..., None], t, present, n)[:, 0]  # [unit]
    alpha_pos = q1.sum(1) / n - beta_pos * ((t * present).sum(1) / n)
    res = (q1 - alpha_pos[:, None] - beta_pos[:, None] * t) * present
    sigma2_pos = (res * res).sum(-1) / (n - 2)
    mean_b[..., 0] = alpha_pos[:, None] + beta_pos[:, None] * plan.tau[cut]
    cov_b[..., 0] = sigma2_pos[:, None]
    return UnitClouds(u, kr, QueryModel(mean_b, cov_b, False, alpha_pos, beta_pos, sigma2_pos), key_slope)


# --------------------------------------------------------------------------- pair kernels


def _pair_rows(kr: torch.Tensor, cut: torch.Tensor, which: torch.Tensor, name: str) -> torch.Tensor:
    """``kr[u, which[cut[u]]]`` ``[unit, pair_bucket, pair, dim]`` (rows gathered from the flattened keys, into a
    scratch buffer)."""
    u, n, d = kr.shape
    rows = (torch.arange(u, device=kr.device)[:, None] * n + which[cut].reshape(u, -1)).reshape(-1)  # [unit * b * p]
    out = scratch(name, (rows.numel(), d), kr)
    return torch.index_select(kr.reshape(u * n, d), 0, rows, out=out).view(u, *which.shape[1:], d)


def pair_block_units(plan: CutPlan, dim: int, device: torch.device) -> int:
    """Units per block of the pair kernels: every unit at once on a GPU, about 4 MB of differences on the CPU."""
    per_unit = 8 * plan.pi.shape[1] * plan.pi.shape[2] * dim
    return 0 if device.type != "cpu" else max(1, PAIR_BLOCK_CPU_BYTES // per_unit)


def counterfactual_means(model: QueryModel, plan: CutPlan, cut: torch.Tensor):
    """The counterfactual models of :func:`qkplast.analysis.decompose.counterfactuals` for each unit.

    Returns the means ``[variant, unit, bucket, dim]`` of variants (1,1), (1,0), (0,1), (0,0) and the covariances
    of the bucket ``[unit, bucket, dim]`` and of the context average ``[unit, dim]``.
    """
    usable, tau = plan.usable[cut], plan.tau[cut]  # [unit, bucket]
    w = usable / usable.sum(-1, keepdim=True)  # [unit, bucket] context-average weights
    tau_bar = (w * tau).sum(-1, keepdim=True)  # [unit, 1]
    drift = model.beta_pos[:, None] * (tau - tau_bar)  # [unit, bucket] query drift about its average level
    mean = torch.nan_to_num(model.mean)  # [unit, bucket, dim]
    avg = torch.einsum("ub,ubd->ud", w, mean)  # [unit, dim]
    e1_drift = torch.zeros_like(mean)
    e1_drift[..., 0] = drift
    means = torch.stack([mean, avg[:, None] + e1_drift, mean - e1_drift, avg[:, None].expand_as(mean)])
    cov = torch.nan_to_num(model.cov)  # [unit, bucket, dim]
    return means, cov, torch.einsum("ub,ubd->ud", w, cov)


#: a variance without the keys' drift is taken from its expansion (below) only where the expansion loses at most a
#: factor this large of relative precision to cancellation; the other pairs are computed from their differences
EXPANSION_CANCELLATION = 4.0


def counterfactual_pair_profiles(clouds: UnitClouds, plan: CutPlan, cut: torch.Tensor) -> torch.Tensor:
    """Closed-form plasticity of the four counterfactual models, averaged over each bucket's pairs
    ``[unit, pair_bucket, variant]`` (variants in :data:`qkplast.analysis.decompose.VARIANTS` order).

    The values of :func:`qkplast.analysis.plasticity.pair_kernel` with the block hook of
    :class:`qkplast.analysis.decompose.Counterfactuals`, on the pair buckets of ``plan`` only. Per block of units the
    key differences ``delta`` are formed once and read twice: one product with six columns gives the four means
    ``m_v^T delta`` (eq. 4.11; the no-drift variants' ``m_v^T (delta - dt g)`` as ``m_v^T delta - dt m_v^T g``) and
    ``sum_d s_d g_d delta_d`` for the two covariances ``s`` (the bucket's, the context average); the squares of
    ``delta`` give ``t1 = sum_d s_d delta_d^2`` (eq. 4.12, the variances with the drift) in a product with two
    columns. Without the drift ``v = sum_d s_d (delta_d - dt g_d)^2 = t1 - 2 dt sum_d s_d g_d delta_d + dt^2 t3``,
    ``t3 = sum_d s_d g_d^2``: its rounding error is below ``2 gamma_d (sqrt(t1) + |dt| sqrt(t3))^2`` (Cauchy-Schwarz on
    the middle term), so where that bound exceeds :data:`EXPANSION_CANCELLATION` times ``v`` (the key drift makes most
    of ``delta``) the pair's ``v`` is computed from ``delta - dt g`` itself, as the per-capture kernel computes every
    one; elsewhere the two agree to about 1e-14 relative. Two passes over the differences replace the per-capture
    kernel's six, and the per-pair arithmetic after them runs once per chunk of units, not per block.
    """
    kr, model, g = clouds.kr, clouds.model, clouds.key_slope  # g [unit, dim]: the keys' drift H beta_K
    n_unit, dim = kr.shape[0], kr.shape[-1]
    sel = torch.as_tensor(plan.pair_buckets, device=kr.device)
    means, cov_b, cov_a = counterfactual_means(model, plan, cut)
    means = means[:, :, sel]  # [variant, unit, pair_bucket, dim]
    covs = torch.stack([cov_b[:, sel], cov_a[:, None].expand(-1, len(sel), -1)], -1)  # [unit, pair_bucket, dim, 2]
    linear = torch.cat([means.permute(1, 2, 3, 0), covs * g[:, None, :, None]], -1)  # [unit, pair_bucket, dim, 6]
    pi, pj = plan.pi[cut], plan.pj[cut]  # [unit, pair_bucket, pair]
    lin = kr.new_empty(*pi.shape, 6)  # m_v^T delta (4), sum_d s_d g_d delta_d (2)
    t1 = kr.new_empty(*pi.shape, 2)  # sum_d s_d delta_d^2 for the two covariances
    for sl in head_chunks(n_unit, pair_block_units(plan, dim, kr.device)):  # the passes over the differences
        delta = _pair_rows(kr[sl], cut[sl], plan.pi, "cut_pair_first")  # [unit, pair_bucket, pair, dim]
        delta = delta.sub_(_pair_rows(kr[sl], cut[sl], plan.pj, "cut_pair_second"))
        matmul(delta, linear[sl], out=lin[sl])
        matmul(delta.mul_(delta), covs[sl], out=t1[sl])
    t = plan.t[cut]  # [unit, n]
    dt = (torch.gather(t, 1, pi.flatten(1)) - torch.gather(t, 1, pj.flatten(1))).view(*pi.shape, 1)  # t_i - t_j
    g_mean = torch.einsum("vubd,ud->ubv", means[2:], g)[:, :, None]  # [unit, pair_bucket, 1, 2] m_v^T g, no drift
    t3 = (covs * (g * g)[:, None, :, None]).sum(-2)[:, :, None]  # [unit, pair_bucket, 1, 2] sum_d s_d g_d^2
    mu = torch.cat([lin[..., :2], lin[..., 2:4] - dt * g_mean], -1)  # [unit, pair_bucket, pair, variant]
    nodrift = t1 - 2 * dt * lin[..., 4:] + dt * dt * t3  # [unit, pair_bucket, pair, 2]
    weight = plan.pweight[cut]  # [unit, pair_bucket, pair]
    bound = (t1.sqrt() + dt.abs() * t3.sqrt()) ** 2  # (sqrt(t1) + |dt| sqrt(t3))^2, the scale of its rounding
    redo = ~(EXPANSION_CANCELLATION * nodrift > bound) & (weight > 0)[..., None]  # cancelled (or NaN)
    if bool(redo.any()):  # from the differences without the drift, as the per-capture kernel computes them
        u, b, p, c = redo.nonzero(as_tuple=True)
        x = kr[u, pi[u, b, p]] - kr[u, pj[u, b, p]] - dt[u, b, p] * g[u]  # [n_redo, dim]
        nodrift[u, b, p, c] = (x * x * covs[u, b, :, c]).sum(-1)
    return pair_means(mu, torch.cat([t1, nodrift], -1), weight[..., None])  # [unit, pair_bucket, variant]


def pair_means(mu: torch.Tensor, var: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """:func:`qkplast.analysis.plasticity.weighted_pair_mean` of the pairwise plasticity ``4 Phi(z) Phi(-z)``
    (:func:`~qkplast.analysis.plasticity.pairwise_plasticity`) over the pair axis ``-2`` of ``[..., pair, model]``
    means and variances, with one erfc: ``4 p (1 - p)`` with ``p = Phi(-|z|) <= 1/2`` (exact from erfc, and
    ``1 - p >= 1/2`` loses nothing) as ``e (2 - e)``, ``e = erfc(|z| / sqrt 2) = 2 p``. Each pair counts with
    ``weight`` (broadcast) unless its variance is not positive; NaN where no pair has weight. In place on ``mu``."""
    ok = var > 0
    e = mu.mul_(mu).div_(torch.where(ok, var, torch.ones_like(var))).mul_(0.5).sqrt_().erfc_()  # 2 Phi(-|z|)
    w = torch.where(ok, weight, torch.zeros_like(var))
    total = w.sum(-2)
    num = e.mul_(2 - e).mul_(w).sum(-2)
    return torch.where(total > 0, num / torch.where(total > 0, total, torch.ones_like(total)),
                       torch.full_like(total, float("nan")))


def rotated_models(clouds: UnitClouds, plan: CutPlan) -> tuple[torch.Tensor, ...]:
    """The closed form's weights of each query unit in the captured basis, for :func:`shared_key_profiles`.

    With ``H = I - s u u^T`` (``s = 2 / ||u||^2``, 0 for ``u = 0``) the rotated pair difference is
    ``H delta = delta - s u (u^T delta)``, so ``m_b^T H delta = (H m_b)^T delta`` and
    ``sum_d S_bd (H delta)_d^2 = sum_d S_bd delta_d^2 - 2 s w sum_d S_bd u_d delta_d + s^2 w^2 sum_d S_bd u_d^2`` with
    ``w = u^T delta``. Returns ``H m_b`` ``[unit, pair_bucket, dim]``, ``S_b`` (the diagonal covariance), ``S_b u``,
    ``u`` ``[unit, dim]``, ``s`` ``[unit]`` and ``sum_d S_bd u_d^2`` ``[unit, pair_bucket]``.
    """
    sel = torch.as_tensor(plan.pair_buckets, device=clouds.u.device)
    u = clouds.u  # [unit, dim]
    uu = (u * u).sum(-1)
    s = torch.where(uu > 0, 2.0 / torch.where(uu > 0, uu, torch.ones_like(uu)), torch.zeros_like(uu))  # [unit]
    mean, cov = clouds.model.mean[:, sel], clouds.model.cov[:, sel]  # [unit, pair_bucket, dim]
    hm = mean - (s[:, None] * (mean * u[:, None]).sum(-1))[..., None] * u[:, None]  # H m_b
    su = cov * u[:, None]  # S_b u
    return hm, cov, su, u, s, (su * u[:, None]).sum(-1)


def shared_key_profiles(k: torch.Tensor, plan: CutPlan, group_cut: torch.Tensor, group_key: torch.Tensor,
                        models: tuple[torch.Tensor, ...], members: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Closed-form profiles ``[group, pair_bucket, member]`` of query units that share their keys.

    A *group* is a cut and a head whose keys ``k[group_key]`` (:func:`padded_source`, as captured) its ``members``
    (query units, rows of ``models`` from :func:`rotated_models`; ``present`` False for padding) are scored against,
    every query head of a GQA layer against one key head for :func:`qkplast.analysis.gqa.cross_profiles_of_cuts`.
    The pair differences ``delta`` of the group's keys are formed once in the captured basis and read twice for
    every member at once: one product gives ``(H m_b)^T delta``, ``sum_d S_bd u_d delta_d`` and ``w = u^T delta`` of
    each member, one product of the squares gives ``sum_d S_bd delta_d^2``. The variance of eq. 4.12 in the member's
    basis is then :func:`rotated_models`' expansion, whose rounding error is below
    ``2 gamma_d (sqrt(sum S delta^2) + s |w| sqrt(sum S u^2))^2``; where that bound exceeds
    :data:`EXPANSION_CANCELLATION` times the variance the pair is scored from its rotated difference instead. The
    values are those of :func:`qkplast.analysis.plasticity.pair_closed_form` on the rotated keys (which has its own
    cancelling form, ``s_i + s_j - 2 c_ij``, recomputed below a ratio of 1e-6).
    """
    hm, cov, su, u, s, suu = (x[members] for x in models)  # [group, member, ...]
    n_group, n_member, n_pb, dim = hm.shape
    # [group, pair_bucket, dim, 3 member]: the three linear forms of every member, one product
    linear = torch.cat([hm, su, u[:, :, None].expand_as(hm)], 1).permute(0, 2, 3, 1).contiguous()
    quad = cov.permute(0, 2, 3, 1).contiguous()  # [group, pair_bucket, dim, member]
    pi, pj = plan.pi[group_cut], plan.pj[group_cut]  # [group, pair_bucket, pair]
    lin = k.new_empty(*pi.shape, 3 * n_member)
    t1 = k.new_empty(*pi.shape, n_member)
    h, n1, _ = k.shape

    def rows(idx: torch.Tensor, sl: slice = slice(None)) -> torch.Tensor:  # [group, pair_bucket * pair] key rows
        return group_key[sl, None] * n1 + torch.gather(plan.samples[group_cut[sl]], 1, idx[sl].flatten(1))

    block = max(1, PAIR_BLOCK_CPU_BYTES // (8 * pi[0].numel() * dim)) if k.device.type == "cpu" else 0
    flat = k.reshape(h * n1, dim)
    for sl in head_chunks(n_group, block):  # the passes over the groups' pair differences
        shape = (pi[sl].numel(), dim)
        delta = torch.index_select(flat, 0, rows(pi, sl).reshape(-1), out=scratch("cut_pair_first", shape, k))
        delta = delta.sub_(torch.index_select(flat, 0, rows(pj, sl).reshape(-1),
                                              out=scratch("cut_pair_second", shape, k))).view(*pi[sl].shape, dim)
        matmul(delta, linear[sl], out=lin[sl])
        matmul(delta.mul_(delta), quad[sl], out=t1[sl])
    mu, sud, w = lin[..., :n_member], lin[..., n_member:2 * n_member], lin[..., 2 * n_member:]
    s_, suu_ = s[:, None, None, :], suu.permute(0, 2, 1)[:, :, None, :]  # [group, 1, 1, member], [g, pb, 1, member]
    var = t1 - 2 * s_ * w * sud + (s_ * w) ** 2 * suu_  # [group, pair_bucket, pair, member]
    weight = plan.pweight[group_cut]  # [group, pair_bucket, pair]
    bound = (t1.sqrt() + s_ * w.abs() * suu_.sqrt()) ** 2
    redo = ~(EXPANSION_CANCELLATION * var > bound) & (weight > 0)[..., None] & present[:, None, None, :]
    if bool(redo.any()):  # the rotated difference itself, squared and weighted
        g_, b_, p_, m_ = redo.nonzero(as_tuple=True)
        x = (flat[rows(pi)[g_, b_ * pi.shape[2] + p_]] - flat[rows(pj)[g_, b_ * pi.shape[2] + p_]])  # [n, dim]
        um = u[g_, m_]  # [n, dim]
        x = x - (s[g_, m_] * (x * um).sum(-1))[:, None] * um  # H delta
        var[g_, b_, p_, m_] = (x * x * cov[g_, m_, b_]).sum(-1)
    pp = pairwise_plasticity(mu, var).movedim(-1, 1)  # [group, member, pair_bucket, pair]
    return weighted_pair_mean(pp, weight[:, None]).movedim(1, -1)  # [group, pair_bucket, member]


# --------------------------------------------------------------------------- chunks of units


def unit_chunk(plan: CutPlan, dim: int, opt: AnalysisOptions, device: torch.device) -> int:
    """Units per chunk (``opt.head_chunk`` when set): the clouds' float64 copies (queries, keys, centred, rotated,
    residuals) of the largest cut and one block of pair differences near :data:`qkplast.tensors.SCRATCH_CPU_MB` on
    the CPU, 1 GB on a GPU."""
    per_unit = 8 * plan.samples.shape[1] * dim * 6 + 8 * plan.pi.shape[1] * plan.pi.shape[2] * (2 * dim + 16)
    return opt.head_chunk or auto_chunk(per_unit, device, SCRATCH_CPU_MB)


def map_units(fn, n_units: int, chunk: int, device: torch.device) -> list:
    """``[fn(s) for s in chunks of the units]``, spread over the CPU's cores (:func:`qkplast.tensors.map_head_chunks`)."""
    return map_head_chunks(fn, n_units, chunk, device)


"""Attention plasticity: closed form and Monte Carlo (thesis section 4.4).

Pipeline per head, vectorised over heads, query buckets and key pairs:

1. Householder reflection ``H`` sending the query drift direction
   ``beta_hat`` (slopes of queries regressed on position) to ``e1`` (eq. 4.10),
   applied to queries and keys alike (it preserves every ``q^T k``).
2. Positional fit of rotated coordinate 1: ``alpha_pos + beta_pos t``, residual
   variance ``sigma_pos^2``; semantic statistics of coordinates 2..d per query
   bucket (mu_b, sigma_b^2).
3. Key pairs ``(i, j)`` from earlier buckets of one document (shared by all
   heads, since every head is captured at the same positions), with
   ``delta = H k_i - H k_j``. Which pairs are drawn and how each is weighted is
   decided once per capture in :mod:`qkplast.analysis.pairs` (:func:`pair_plan`);
   this module holds the query model, the kernels, the Dataset and the diagnostics.
4. Closed form (eqs. 4.11-4.14): ``mu = delta^T m_b``, ``v = delta^T S_b delta``,
   ``PP = 4 Phi(z) Phi(-z)`` with ``z = mu / sqrt(v)``; the product form keeps
   full relative precision when ``Phi(z)`` rounds to 1, where ``4 p (1 - p)``
   would return 0. ``delta`` is never formed for the closed form: ``mu`` and
   ``v`` come from per-key projections ``m_b^T K``, ``sigma_b^2 . (K * K)`` and
   one weighted dot per pair (:func:`pair_moments`).
5. Monte Carlo: for the same pairs, the fraction ``p`` of the bucket's captured
   queries with ``q^T k_i > q^T k_j`` (ties count one half), giving
   ``4 p (1 - p)`` with no Gaussian assumption. The signs come from a float32
   product whose rounding bound certifies each one to be the float64 sign
   (:mod:`qkplast.analysis.certified_signs`).
6. Aggregates of 4.4.5: ``ap`` per query bucket, ``ap_overall``,
   ``ap_first20``, ``ap_last20``, ``ap_drop``, the context profile, and the 2D
   map over inter-key distance and query-to-key-midpoint distance.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr

from qkplast.tensors import (SCRATCH_CPU_MB, as_f64, auto_chunk, einsum, head_chunks, head_vectors, map_head_chunks, matmul,
                     resolve_device, scratch, to_numpy)
from qkplast.analysis.linalg import householder_apply, householder_vector
from qkplast.analysis.moments import CloudMoments, cloud_moments
from qkplast.options import AnalysisOptions
from qkplast.analysis.vectors import analysis_vectors
from qkplast.analysis.certified_signs import PairRows, bucket_rows, float64_sign_sums, sign_sums
from qkplast.analysis.compiled import pair_terms
from qkplast.analysis.moments import slope
from qkplast.analysis.pairs import PairPlan, PlasticityWarning, pair_plan

_SQRT1_2 = 1 / math.sqrt(2)


# --------------------------------------------------------------------------- kernels


def ndtr(z: torch.Tensor) -> torch.Tensor:
    """Standard normal CDF accurate in the lower tail.

    ``torch.special.ndtr`` goes through ``1 + erf``, which cancels for z < -5:
    it returns 0 at z = -10 where Phi is 7.6e-24. ``erfc`` has no such loss.
    """
    return 0.5 * torch.special.erfc(-z * _SQRT1_2)


def pairwise_plasticity(mu: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """``4 Phi(z) Phi(-z)`` with ``z = mu / sqrt(var)`` (eq. 4.14); NaN where ``var <= 0``.

    Written as a product of the two tails so that neither side underflows
    before the result does: for z = 10, ``4 p (1 - p)`` with ``p = Phi(z)``
    returns exactly 0 while this returns 3.0e-23 (Phi from ``erfc``, see :func:`ndtr`).
    """
    ok = var > 0
    z = mu / torch.sqrt(torch.where(ok, var, torch.ones_like(var)))
    pp = 4 * ndtr(z) * ndtr(-z)
    return torch.where(ok, pp, torch.full_like(pp, float("nan")))


def bucket_members(onehot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample indices of each bucket, padded: ``[bucket, n_max]`` indices and a mask of the real ones.

    ``onehot`` ``[bucket, sample]`` has one 1 per column; members keep their sample order.
    """
    counts = onehot.sum(1).long()  # [bucket]
    order = torch.argsort(onehot.argmax(0), stable=True)  # [sample] grouped by bucket
    slot = torch.arange(max(int(counts.max()), 1), device=onehot.device)  # [n_max]
    present = slot[None] < counts[:, None]  # [bucket, n_max]
    at = (torch.cumsum(counts, 0) - counts)[:, None] + slot[None]  # [bucket, n_max]
    return torch.where(present, order[at.clamp_max(order.numel() - 1)], 0), present.to(onehot.dtype)


@dataclass
class QueryModel:
    """Per-head, per-bucket Gaussian model of rotated queries: mean ``[head, bucket, dim]`` and
    covariance, either its diagonal ``[head, bucket, dim]`` or full ``[head, bucket, dim, dim]``."""

    mean: torch.Tensor
    cov: torch.Tensor
    full: bool
    alpha_pos: torch.Tensor  # [head]
    beta_pos: torch.Tensor  # [head]
    sigma2_pos: torch.Tensor  # [head]


def query_model(qr: torch.Tensor, t: torch.Tensor, onehot: torch.Tensor, tau: torch.Tensor,
                options: AnalysisOptions) -> QueryModel:
    """Gaussian model of rotated queries per bucket (eqs. 4.11-4.12 and the options).

    ``qr`` ``[head, sample, dim]`` rotated queries, ``onehot`` ``[bucket, sample]``
    bucket membership, ``tau`` ``[bucket]``.
    """
    n = onehot.sum(1)  # [bucket]
    denom = (n - 1).clamp_min(1)
    # bucket sums by index (segment sums): h*s*d work instead of the one-hot product's h*b*s*d
    idx = onehot.argmax(0)  # [sample] bucket of each sample
    mean_b = qr.new_zeros(qr.shape[0], onehot.shape[0], qr.shape[-1]).index_add_(1, idx, qr)
    mean_b = mean_b / n.clamp_min(1)[:, None]  # [head, bucket, dim]
    # each sample minus the mean of its own bucket (two-pass variance, no E[x^2] - E[x]^2 cancellation)
    resid = torch.index_select(mean_b, 1, idx, out=scratch("query_residuals", tuple(qr.shape), qr))
    resid = torch.sub(qr, resid, out=resid)  # [head, sample, dim]
    full = options.covariance in ("full", "joint")
    if full:
        # one Gram matrix per bucket of that bucket's samples only (padded rows zero): h*s*d*d work, where a
        # product with the one-hot matrix costs h*b*s*d*d
        members, present = bucket_members(onehot)  # [bucket, n_max]
        r = resid[:, members] * present[None, :, :, None]  # [head, bucket, n_max, dim]
        cov_b = r.transpose(-1, -2) @ r / denom[:, None, None]  # [head, bucket, dim, dim]
    else:
        cov_b = torch.zeros_like(mean_b).index_add_(1, idx, resid.mul_(resid)) / denom[:, None]
    if options.semantic_stats == "global":
        mean_g, cq = qr.mean(1), qr - qr.mean(1, keepdim=True)
        cov_g = cq.transpose(1, 2) @ cq / (qr.shape[1] - 1) if full else cq.var(1)
        mean_b = mean_g[:, None].expand_as(mean_b).clone()
        cov_b = cov_g[:, None].expand_as(cov_b).clone()
    # Coordinate 1: global linear fit in position (eq. 4.11) unless per-bucket moments are asked for.
    q1 = qr[..., 0]  # [head, sample]
    beta_pos = slope(q1[..., None], t)[..., 0]
    alpha_pos = q1.mean(-1) - beta_pos * t.mean()
    res = q1 - alpha_pos[:, None] - beta_pos[:, None] * t
    sigma2_pos = (res * res).sum(-1) / (qr.shape[1] - 2)
    if options.positional_fit == "global":
        mean_b[..., 0] = alpha_pos[:, None] + beta_pos[:, None] * tau
        if full:
            cov_b[..., 0, :] = 0.0
            cov_b[..., :, 0] = 0.0
            cov_b[..., 0, 0] = sigma2_pos[:, None]
        else:
            cov_b[..., 0] = sigma2_pos[:, None]
    elif options.covariance == "full":  # per-bucket moments of coordinate 1, still independent of 2..d
        var1 = cov_b[..., 0, 0].clone()
        cov_b[..., 0, :] = 0.0
        cov_b[..., :, 0] = 0.0
        cov_b[..., 0, 0] = var1
    return QueryModel(mean_b, cov_b, full, alpha_pos, beta_pos, sigma2_pos)


def closed_form_kernel(delta: torch.Tensor, model: QueryModel) -> torch.Tensor:
    """Pairwise plasticity ``[head, bucket, pair]`` from key differences ``delta`` ``[head, bucket, pair, dim]``.

    The straightforward form of eqs. 4.11-4.14 on the pairs' difference
    vectors: the reference :func:`pair_closed_form` is tested against, and the
    path :func:`plasticity` takes, where the Monte Carlo estimate needs
    ``delta`` anyway.
    """
    # products and sums over dim rather than einsum: einsum makes these batched matrix-vector products, several
    # times slower on the CPU than one elementwise pass
    work = scratch("closed_form", tuple(delta.shape), delta)  # [head, bucket, pair, dim]
    mu = torch.mul(delta, model.mean[:, :, None], out=work).sum(-1)  # [head, bucket, pair], eq. 4.11
    if model.full:
        var = torch.einsum("hbpd,hbde,hbpe->hbp", delta, model.cov, delta)  # Lemma A.1 variance
    else:
        var = torch.mul(delta, delta, out=work).mul_(model.cov[:, :, None]).sum(-1)  # eq. 4.12
    return pairwise_plasticity(mu, var)


def weighted_square_sums(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``sum_d w[h, b, d] x[h, b, p, d]^2`` ``[head, bucket, pair]`` (eq. 4.12's ``v`` for ``x = delta``), with no
    temporary of ``x``'s size on the CPU (:func:`qkplast.tensors.einsum`)."""
    return einsum("hbpd,hbpd,hbd->hbp", x, x, w)


def pair_differences(kr: torch.Tensor, pi: torch.Tensor, pj: torch.Tensor) -> torch.Tensor:
    """``kr[:, pi] - kr[:, pj]`` ``[head, bucket, pair, dim]`` for keys ``[head, sample, dim]`` and pairs ``[bucket, pair]``.

    Rows gathered from the flattened keys (``index_select`` copies whole rows;
    measured 2.5x faster than advanced indexing here), into scratch tensors
    (:func:`qkplast.tensors.scratch`): inside :func:`~qkplast.tensors.map_head_chunks`
    the result is valid until the same thread's next call.
    """
    h, s, d = kr.shape
    flat = kr.reshape(h * s, d)
    offset = torch.arange(h, device=kr.device)[:, None] * s  # [head, 1]
    rows = lambda idx: (offset + idx.reshape(1, -1)).reshape(-1)  # noqa: E731  [head * bucket * pair]
    first, second = (scratch(name, (h * pi.numel(), d), kr) for name in ("pair_first", "pair_second"))
    torch.index_select(flat, 0, rows(pi), out=first)
    torch.index_select(flat, 0, rows(pj), out=second)
    return first.sub_(second).view(h, *pi.shape, d)  # [head, bucket, pair, dim]


def rotate(q: torch.Tensor, k: torch.Tensor, t: torch.Tensor):
    """Householder vector ``u`` ``[head, dim]`` of the query drift (eq. 4.10) and the rotated ``q``, ``k``."""
    beta = slope(q, t)  # [head, dim]  query drift, eq. 4.10
    if (torch.linalg.vector_norm(beta, dim=-1) == 0).any():
        raise ValueError("a head has zero query drift (beta = 0): the Householder direction is undefined")
    u = householder_vector(beta)
    return u, householder_apply(u, q), householder_apply(u, k)  # [head, sample, dim]


#: a fast variance below this fraction of the two keys' own quadratic forms is recomputed from delta
_CANCELLATION = 1e-6


def _pair_gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x[h, b, idx[b, p]]`` for ``x`` ``[head, bucket, sample]`` and ``idx`` ``[bucket, pair]``."""
    return torch.gather(x, 2, idx[None].expand(x.shape[0], -1, -1))  # [head, bucket, pair]


def pair_moments(kr: torch.Tensor, pi: torch.Tensor, pj: torch.Tensor, model: QueryModel):
    """Score mean ``mu`` and variance ``v`` ``[head, bucket, pair]`` of eqs. 4.11-4.12 without forming delta.

    ``mu = m_b^T k_i - m_b^T k_j`` from the per-key projections ``m_b^T K``
    (``[head, bucket, sample]``). With a diagonal covariance
    ``v = s_i + s_j - 2 c_ij`` where ``s = sigma_b^2 . (K * K)`` per key and
    ``c_ij = sum_d sigma_bd^2 k_id k_jd`` is one weighted dot per pair; with a
    full one ``v = k_i^T S k_i + k_j^T S k_j - 2 k_j^T S k_i`` from ``S k_i``
    of the pairs' keys only. The subtraction loses relative precision when the
    two keys nearly coincide (``v`` much smaller than ``s_i + s_j``); those
    pairs (below a ratio of 1e-6) are recomputed from their difference vector,
    so every ``v`` keeps about 10 significant digits or more.
    """
    mk = torch.einsum("hsd,hbd->hbs", kr, model.mean)  # [head, bucket, sample]
    mu = _pair_gather(mk, pi) - _pair_gather(mk, pj)  # [head, bucket, pair]
    ki, kj = kr[:, pi], kr[:, pj]  # [head, bucket, pair, dim]
    if model.full:
        si = torch.einsum("hbpd,hbde->hbpe", ki, model.cov)  # [head, bucket, pair, dim]
        own = (si * ki).sum(-1) + torch.einsum("hbpd,hbde,hbpe->hbp", kj, model.cov, kj)
        var = own - 2 * (si * kj).sum(-1)
    else:
        sk = torch.einsum("hsd,hbd->hbs", kr * kr, model.cov)  # [head, bucket, sample]
        own = _pair_gather(sk, pi) + _pair_gather(sk, pj)
        var = own - 2 * (ki * model.cov[:, :, None, :] * kj).sum(-1)
    bad = var <= _CANCELLATION * own.abs()
    if bad.any():
        h, b, p = bad.nonzero(as_tuple=True)
        d = kr[h, pi[b, p]] - kr[h, pj[b, p]]  # [n_bad, dim]
        if model.full:
            var[h, b, p] = torch.einsum("nd,nde,ne->n", d, model.cov[h, b], d)
        else:
            var[h, b, p] = (d * d * model.cov[h, b]).sum(-1)
    return mu, var


def pair_closed_form(kr: torch.Tensor, pi: torch.Tensor, pj: torch.Tensor, model: QueryModel) -> torch.Tensor:
    """Pairwise plasticity ``[head, bucket, pair]`` (eqs. 4.11-4.14) from rotated keys ``[head, sample, dim]``.

    Same values as :func:`closed_form_kernel` on ``delta = kr[:, pi] - kr[:, pj]``
    (to rounding), computed through :func:`pair_moments`.
    """
    return pairwise_plasticity(*pair_moments(kr, pi, pj, model))


def monte_carlo_kernel(qr: torch.Tensor, delta: torch.Tensor, qidx: torch.Tensor, qmask: torch.Tensor,
                       unbiased: bool = True) -> torch.Tensor:
    """Empirical pairwise plasticity ``[head, bucket, pair]`` from the bucket's own queries.

    ``qidx``/``qmask`` ``[bucket, n_max]`` list each bucket's query samples (padded).
    """
    # Padding rows are zeroed, so their score is exactly 0 and their sign adds nothing: with s = sum of signs
    # over the bucket's n queries, p = (#wins + #ties / 2) / n = (s / n + 1) / 2, one reduction and no mask pass.
    return _from_sign_sums(float64_sign_sums(delta, bucket_rows(qr, qidx, qmask)), qmask, unbiased)


def _from_sign_sums(signs: torch.Tensor, qmask: torch.Tensor, unbiased: bool) -> torch.Tensor:
    """``4 p (1 - p)`` (times ``n / (n - 1)`` when ``unbiased``) from the sums of score signs over each bucket's
    ``n`` queries ``[head, bucket, pair]``: ``p = (s / n + 1) / 2`` counts a tie as half a win; NaN where n < 2."""
    n = qmask.sum(1).to(signs.dtype)[None, :, None]  # [1, bucket, 1]
    p = (signs / n.clamp_min(1) + 1) / 2  # [head, bucket, pair]
    pp = 4 * p * (1 - p)
    if unbiased:
        pp = pp * n / (n - 1).clamp_min(1)
    return torch.where(n >= 2, pp, torch.full_like(pp, float("nan")))


def pair_kernel(qr: torch.Tensor, kr: torch.Tensor, pi: torch.Tensor, pj: torch.Tensor, model: QueryModel,
                qidx: torch.Tensor, qmask: torch.Tensor, unbiased: bool = True, *, monte_carlo: bool = True,
                block_hook=None):
    """Closed-form and Monte Carlo pairwise plasticity ``[head, bucket, pair]`` of a query model.

    The values of :func:`closed_form_kernel` and :func:`monte_carlo_kernel` on
    the key differences ``delta = kr[:, pi] - kr[:, pj]`` (the closed form to
    rounding, the Monte Carlo signs as the float64 product gives them), with
    ``mu`` (eq. 4.11) as one matrix-vector product, ``v`` (eq. 4.12) as one
    weighted sum of squares (:func:`weighted_square_sums`; Lemma A.1's
    quadratic form for a full covariance), and the Monte Carlo signs from a
    float32 product certified by a rounding bound
    (:func:`qkplast.analysis.certified_signs.sign_sums`). The differences are formed per
    block of heads small enough to stay in cache, and every pass over them
    happens while the block is there.

    Parameters
    ----------
    monte_carlo : bool
        Compute the Monte Carlo values (else that output is None).
    block_hook : optional
        How the AP_drop decomposition (:mod:`qkplast.analysis.decompose`) reuses the key differences instead of
        forming them again: ``block_hook(delta, sl)`` gives each block's terms ``[head, bucket, pair, n]`` from its
        differences (rows ``sl`` of the chunk); on the CPU with a diagonal covariance the compiled pass computes
        the same terms from ``block_hook.pair_inputs(sl)`` and ``block_hook.dt`` instead. The terms, concatenated
        over blocks, go through ``block_hook.from_terms`` once and are returned third.

    Returns
    -------
    ``(pp, pp_mc)``, or ``(pp, pp_mc, hooked)`` when ``block_hook`` is given.
    """
    blocks = list(head_chunks(qr.shape[0], pair_block_heads(pi.numel(), qr.shape[-1], qr.device)))
    moments, signs, hooked = zip(*(_pair_block(qr[sl], kr[sl], pi, pj, model.mean[sl], model.cov[sl], model.full,
                                               qidx, qmask, monte_carlo, block_hook, sl) for sl in blocks))
    mu, var = (torch.cat(x) for x in zip(*moments))  # [head, bucket, pair]
    pp_mc = _from_sign_sums(torch.cat(signs), qmask, unbiased) if monte_carlo else None
    if block_hook is None:
        return pairwise_plasticity(mu, var), pp_mc
    return pairwise_plasticity(mu, var), pp_mc, block_hook.from_terms(torch.cat(hooked))


#: bytes of one block's pair differences in :func:`pair_kernel` on the CPU: small enough that the passes over them
#: (the closed form's two, the float32 copy) find them in cache; 1-head blocks of 4 MB ran the pair-level passes of
#: the 300-head benchmark in 0.20 s against 0.36 s in 8-head blocks
PAIR_BLOCK_CPU_BYTES = 4 * 2**20


def pair_block_heads(n_pairs: int, dim: int, device: torch.device) -> int:
    """Heads per block of :func:`pair_kernel`: every head at once on a GPU, about 4 MB of differences on the CPU."""
    return 0 if device.type != "cpu" else max(1, PAIR_BLOCK_CPU_BYTES // (8 * n_pairs * dim))


def _pair_block(qr, kr, pi, pj, mean, cov, full, qidx, qmask, monte_carlo, hook, sl):
    """``(mu, v)``, the Monte Carlo sign sums and the hook's result ``[head, bucket, pair]`` of a block of heads
    (:func:`pair_kernel`)."""
    if kr.device.type == "cpu" and not full:
        return _compiled_pair_block(qr, kr, pi, pj, mean, cov, qidx, qmask, monte_carlo, hook, sl)
    delta = pair_differences(kr, pi, pj)  # [head, bucket, pair, dim]
    mu = matmul(delta, mean[..., None])[..., 0]  # [head, bucket, pair], eq. 4.11
    if full:
        var = torch.einsum("hbpd,hbde,hbpe->hbp", delta, cov, delta)  # Lemma A.1 variance
    else:
        var = weighted_square_sums(delta, cov)  # [head, bucket, pair], eq. 4.12
    signs = sign_sums(delta, qr, qidx, qmask) if monte_carlo else None
    hooked = hook(delta, sl) if hook is not None else None
    return (mu, var), signs, hooked


def _compiled_pair_block(qr, kr, pi, pj, mean, cov, qidx, qmask, monte_carlo, hook, sl):
    """:func:`_pair_block` with a diagonal covariance on the CPU: every pair-level term from one compiled pass over
    the pairs (:func:`qkplast.analysis.compiled.pair_terms`), which never stores the float64 differences; the hook's
    variants ride along (``hook.pair_inputs``, ``hook.from_terms``)."""
    means, weights = mean[:, :, None], cov[:, :, None]  # [head, bucket, 1, dim]
    drift = drift_means = drift_weights = dt = None
    if hook is not None:
        hook_means, hook_weights, drift, drift_means, drift_weights = hook.pair_inputs(sl)
        means, weights, dt = torch.cat([means, hook_means], 2), torch.cat([weights, hook_weights], 2), hook.dt
    mu, var, drift_mu, drift_var, rows32, square_sums = pair_terms(kr, pi, pj, means, weights, dt, drift,
                                                                   drift_means, drift_weights)
    rows = PairRows(kr, pi, pj, rows32, square_sums)
    signs = sign_sums(rows, qr, qidx, qmask) if monte_carlo else None
    hooked = None
    if hook is not None:  # the order of the hook's own terms: mu10, var10, mu01, var01, mu00, var00
        hooked = torch.stack([mu[..., 1], var[..., 1], drift_mu[..., 0], drift_var[..., 0], drift_mu[..., 1],
                              drift_var[..., 1]], -1)  # [head, bucket, pair, 6]
    return (mu[..., 0], var[..., 0]), signs, hooked


def closed_form(q, k, t, onehot, tau, pi, pj, options: AnalysisOptions):
    """Householder rotation, query model and closed-form pairwise plasticity for a chunk of heads.

    ``q``, ``k`` ``[head, sample, dim]``; ``pi``, ``pj`` ``[bucket, pair]`` sample indices.
    Returns rotated queries and keys ``[head, sample, dim]``, the
    :class:`QueryModel` and pairwise plasticity ``[head, bucket, pair]``.
    """
    _, qr, kr = rotate(q, k, t)
    model = query_model(qr, t, onehot, tau, options)
    return qr, kr, model, pair_closed_form(kr, pi, pj, model)


def weighted_pair_mean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Weighted mean over the last axis of ``x`` ``[..., pair]`` with weights ``w`` (broadcast), NaN-aware."""
    w = torch.where(torch.isnan(x), torch.zeros_like(x), w.expand_as(x))
    ws = w.sum(-1)
    s = (torch.nan_to_num(x) * w).sum(-1)
    return torch.where(ws > 0, s / torch.where(ws > 0, ws, torch.ones_like(ws)), torch.full_like(s, float("nan")))


def weighted_pair_se(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Standard error of :func:`weighted_pair_mean` over the pair draw: ``sqrt(n/(n-1) sum w^2 (x - m)^2) / sum w``.

    With equal weights this is ``sd / sqrt(n)``. It measures the sampling of key
    pairs only; the pairs of one bucket share its queries, so the query-sampling
    part of the Monte Carlo error is not in it.
    """
    w = torch.where(torch.isnan(x), torch.zeros_like(x), w.expand_as(x))
    m = weighted_pair_mean(x, w)
    n = (w > 0).sum(-1).to(x.dtype)
    ws = w.sum(-1)
    ss = (w * w * torch.nan_to_num(x - m[..., None]) ** 2).sum(-1)
    ok = n >= 2
    se = torch.sqrt(ss * n / (n - 1).clamp_min(1)) / torch.where(ws > 0, ws, torch.ones_like(ws))
    return torch.where(ok, se, torch.full_like(se, float("nan")))


# --------------------------------------------------------------------------- public


def _weighted_nanmean(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    ok = ~np.isnan(x) & (w > 0)
    ws = np.where(ok, w, 0.0).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ws > 0, np.where(ok, x * w, 0.0).sum(-1) / ws, np.nan)


def edge_masks(tau: np.ndarray, seq_len: int, opt: AnalysisOptions) -> tuple[np.ndarray, np.ndarray]:
    """First and last parts of the context, by the rule ``ap_first20``/``ap_last20`` use (section 4.4.5)."""
    n = len(tau)
    if opt.edge_rule == "position":
        frac = tau / seq_len
        return frac < opt.edge_fraction, frac >= 1 - opt.edge_fraction
    m = math.ceil(opt.edge_fraction * n)
    idx = np.arange(n)
    return idx < m, idx >= n - m


def bucket_weights(width, counts, opt: AnalysisOptions) -> np.ndarray:
    return {"tokens": width.astype(float), "samples": counts.astype(float),
            "uniform": np.ones(len(width))}[opt.bucket_weight]


def summarize_profile(ap: np.ndarray, tau: np.ndarray, width, counts, seq_len: int, opt: AnalysisOptions) -> dict:
    """The aggregates of section 4.4.5 from per-bucket plasticity ``ap`` ``[head, bucket]``.

    Returns ``{name: (dims, values)}`` for ``ap_overall`` (weighted per
    ``opt.bucket_weight``), ``ap_first20``, ``ap_last20``, ``ap_drop`` and the
    context profile ``ap_context``; buckets with NaN plasticity are left out.
    """
    first, last = edge_masks(tau, seq_len, opt)
    ctx = np.clip(np.digitize(tau / seq_len, np.linspace(0, 1, opt.context_bins + 1)) - 1, 0, opt.context_bins - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices are reported as NaN by design
        f20 = np.nanmean(np.where(first, ap, np.nan), -1)
        l20 = np.nanmean(np.where(last, ap, np.nan), -1)
        prof = np.stack([np.nanmean(np.where(ctx == c, ap, np.nan), -1) for c in range(opt.context_bins)], -1)
    return {
        "ap_overall": ("head", _weighted_nanmean(ap, bucket_weights(width, counts, opt))),
        "ap_first20": ("head", f20),
        "ap_last20": ("head", l20),
        "ap_drop": ("head", f20 - l20),
        "ap_context": (("head", "context_bin"), prof),
    }


def bytes_per_head(lay: "PairPlan", dim: int, opt: AnalysisOptions, monte_carlo: bool,
                   device: torch.device = torch.device("cpu")) -> int:
    """Largest temporaries per head of a chunk: its clouds' float64 copies (centred, rotated, residuals) and,
    unless :func:`pair_kernel` works through them in blocks of its own, the pairs' gathered keys (and the Monte
    Carlo scores)."""
    clouds = 8 * lay.t.numel() * dim * 6
    n_bucket, n_pairs, n_max = len(lay.buckets), lay.pi.shape[1], lay.qidx.shape[1]
    cov = 8 * n_bucket * dim * dim * 3 if opt.covariance != "diagonal" else 0  # the model's and two counterfactuals'
    if pair_block_heads(lay.pi.numel(), dim, device):  # pair_kernel works through its own small blocks
        return clouds + cov
    return clouds + cov + 8 * n_bucket * n_pairs * (3 * dim + (n_max if monte_carlo else 0))


def closed_form_ap(capture: xr.Dataset, options: AnalysisOptions) -> tuple[np.ndarray, "PairPlan"]:
    """Closed-form plasticity ``[head, query_bucket]`` only: no Monte Carlo, no maps."""
    dev = resolve_device(options.device)
    lay = pair_plan(capture, options, dev, warn=False)
    chunk = options.head_chunk or auto_chunk(bytes_per_head(lay, capture.sizes["dim"], options, False, dev), dev)

    def one_chunk(sl: slice) -> torch.Tensor:
        q, k = (as_f64(x, dev) for x in head_vectors(capture, sl, dev))
        return weighted_pair_mean(closed_form(q, k, lay.t, lay.onehot, lay.tau, lay.pi, lay.pj, options)[3], lay.pweight)

    return to_numpy(torch.cat(map_head_chunks(one_chunk, capture.sizes["head"], chunk, dev))), lay


@dataclass
class PlasticityChunk:
    """What :func:`plasticity_kernel` returns for a chunk of heads; :func:`plasticity_dataset` joins the chunks."""

    ap: torch.Tensor  # [head, bucket] closed form
    ap_mc: torch.Tensor | None  # [head, bucket] Monte Carlo (None: not computed)
    ap_mc_se: torch.Tensor | None  # [head, bucket]
    map_sum: torch.Tensor  # [head, cell] closed-form sums per 2D-map cell
    map_mc_sum: torch.Tensor | None  # [head, cell]
    map_count: torch.Tensor  # [head, cell] pairs per cell with a defined value
    fit: torch.Tensor  # [head, 3] alpha_pos, beta_pos, sigma2_pos
    n_bad_var: int  # valid (head, pair) combinations with zero score variance
    extra: torch.Tensor | None = None  # what a block hook of pair_kernel returned (the AP_drop decomposition's)


@dataclass
class Rotated:
    """A chunk of heads in the Householder basis of its query drift (eq. 4.10), with its query model.

    ``qr`` (queries with their mean) and ``kr`` (centred keys) ``[head, sample, dim]`` live in per-thread
    scratch buffers: valid until the same thread's next call. ``key_slope`` ``[head, dim]`` is ``H beta_K``,
    the keys' slope over position in the same basis.
    """

    u: torch.Tensor
    qr: torch.Tensor
    kr: torch.Tensor
    model: QueryModel
    key_slope: torch.Tensor


def rotated_clouds(m: CloudMoments, lay: PairPlan, opt: AnalysisOptions) -> Rotated:
    """Turn a chunk's centred clouds into the Householder basis of the query drift ``m.beta_q`` (eq. 4.10)
    and fit the query model there (eqs. 4.11-4.12); the keys stay centred (only their differences are used),
    the queries get their mean back (the Monte Carlo scores need it)."""
    if (torch.linalg.vector_norm(m.beta_q, dim=-1) == 0).any():
        raise ValueError("a head has zero query drift (beta = 0): the Householder direction is undefined")
    u = householder_vector(m.beta_q)  # eq. 4.10
    qr = torch.add(m.centred_q, m.mean_q[:, None], out=scratch("rotated_q", tuple(m.centred_q.shape), m.centred_q))
    qr = householder_apply(u, qr, out=qr)  # [head, sample, dim]
    model = query_model(qr, lay.t, lay.onehot, lay.tau, opt)
    kr = householder_apply(u, m.centred_k, out=scratch("rotated_k", tuple(m.centred_k.shape), m.centred_k))
    key_slope = householder_apply(u, (m.cross_k / m.stt)[:, None, :])[:, 0]  # [head, dim]
    return Rotated(u, qr, kr, model, key_slope)


def plasticity_kernel(m: CloudMoments, lay: PairPlan, opt: AnalysisOptions, rotated: Rotated | None = None,
                      block_hook=None, monte_carlo: bool = True) -> PlasticityChunk:
    """Closed-form and Monte Carlo plasticity of a chunk of heads (eqs. 4.10-4.14), from its centred clouds.

    ``rotated`` (from :func:`rotated_clouds`) is computed here when not given; ``block_hook`` is handed to
    :func:`pair_kernel` and its per-bucket result kept in the chunk's ``extra``. Without ``monte_carlo`` the
    Monte Carlo fields are None (the closed form is the same).
    """
    rot = rotated or rotated_clouds(m, lay, opt)
    out = pair_kernel(rot.qr, rot.kr, lay.pi, lay.pj, rot.model, lay.qidx, lay.qmask, opt.mc_unbiased,
                      monte_carlo=monte_carlo, block_hook=block_hook)
    pp, pp_mc = out[:2]
    map_sum, map_count = _map_sums(pp, lay)
    model = rot.model
    mc = pp_mc is not None
    return PlasticityChunk(
        ap=weighted_pair_mean(pp, lay.pweight), ap_mc=weighted_pair_mean(pp_mc, lay.pweight) if mc else None,
        ap_mc_se=weighted_pair_se(pp_mc, lay.pweight) if mc else None, map_sum=map_sum,
        map_mc_sum=_map_sums(pp_mc, lay)[0] if mc else None,
        map_count=map_count, fit=torch.stack([model.alpha_pos, model.beta_pos, model.sigma2_pos], -1),
        n_bad_var=int((torch.isnan(pp) & lay.pvalid).sum()), extra=out[2] if block_hook is not None else None,
    )


def _map_sums(pp: torch.Tensor, lay: PairPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums and counts ``[head, cell]`` of the defined pairwise values in each cell of the 2D map."""
    flat = pp.reshape(pp.shape[0], -1)  # [head, bucket * pair]
    ok = (lay.pvalid.reshape(-1)[None] & ~torch.isnan(flat)).to(torch.float64)
    total = torch.zeros(pp.shape[0], lay.n_cells, dtype=torch.float64, device=pp.device)
    count = torch.zeros_like(total)
    return total.index_add_(1, lay.cell, torch.nan_to_num(flat) * ok), count.index_add_(1, lay.cell, ok)


def plasticity(capture: xr.Dataset, options: AnalysisOptions | None = None, *, monte_carlo: bool = True,
               **overrides) -> xr.Dataset:
    """Closed-form and Monte Carlo attention plasticity per head and query bucket.

    Returns a Dataset with ``ap``, ``ap_mc`` (dims ``head, query_bucket``);
    ``ap_overall``, ``ap_first20``, ``ap_last20``, ``ap_drop`` and their ``_mc``
    twins (``head``); ``ap_context`` (``head, context_bin``); ``ap_map``,
    ``ap_mc_map`` (``head, key_distance, query_distance``) with ``map_count``;
    the positional fit ``alpha_pos``, ``beta_pos``, ``sigma2_pos``.
    NaN marks a bucket without admissible pairs or with too few queries, with a
    :class:`PlasticityWarning` naming the bucket. ``monte_carlo=False`` leaves out every Monte Carlo variable
    (``ap_mc``, ``ap_mc_se``, the ``_mc`` aggregates, ``ap_mc_map``), whose certified signs are most of the work;
    the closed-form ones are the same.
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    capture = analysis_vectors(capture, opt)
    dev = resolve_device(opt.device)
    lay = pair_plan(capture, opt, dev, warn=True)
    chunk = opt.head_chunk or auto_chunk(bytes_per_head(lay, capture.sizes["dim"], opt, True, dev), dev, SCRATCH_CPU_MB)
    kernel = lambda sl: plasticity_kernel(  # noqa: E731
        cloud_moments(*head_vectors(capture, sl, dev), lay.t, scatter=False), lay, opt, monte_carlo=monte_carlo)
    return plasticity_dataset(map_head_chunks(kernel, capture.sizes["head"], chunk, dev), lay,
                              int(capture.attrs["seq_len"]), opt)


def plasticity_dataset(chunks: list[PlasticityChunk], lay: PairPlan, seq_len: int, opt: AnalysisOptions) -> xr.Dataset:
    """The Dataset of :func:`plasticity` from the results of consecutive chunks of heads."""
    n_bad_var = sum(c.n_bad_var for c in chunks)
    if n_bad_var:
        warnings.warn(f"{n_bad_var} (head, pair) combinations have zero score variance (identical keys "
                      "or degenerate queries); they are left out of the averages", PlasticityWarning, stacklevel=3)
    cat = lambda name: to_numpy(torch.cat([getattr(c, name) for c in chunks]))  # noqa: E731
    mc = chunks[0].ap_mc is not None  # Monte Carlo variables computed
    ap, count = cat("ap"), cat("map_count")
    pairs, width, counts = lay.pairs, lay.width, lay.counts
    aggregates = lambda a, suffix: {  # noqa: E731
        f"{name}{suffix}": value for name, value in summarize_profile(a, pairs.tau, width, counts, seq_len, opt).items()
    }
    shape = (-1, opt.map_bins, opt.map_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        ap_map, ap_mc_map = (np.where(count > 0, cat(name) / np.maximum(count, 1), np.nan).reshape(shape) if mc
                             or name == "map_sum" else None for name in ("map_sum", "map_mc_sum"))
    fit = cat("fit")
    edges = np.linspace(0.0, seq_len, opt.map_bins + 1)
    centers = 0.5 * (edges[1:] + edges[:-1])
    first20, last20 = edge_masks(pairs.tau, seq_len, opt)
    hb, hkq = ("head", "query_bucket"), ("head", "key_distance", "query_distance")
    variables = {"ap": (hb, ap), "ap_mc": (hb, cat("ap_mc")) if mc else None,
                 "ap_mc_se": (hb, cat("ap_mc_se")) if mc else None, **aggregates(ap, ""),
                 **(aggregates(cat("ap_mc"), "_mc") if mc else {}), "ap_map": (hkq, ap_map),
                 "ap_mc_map": (hkq, ap_mc_map) if mc else None}
    ds = xr.Dataset(
        {
            **{name: v for name, v in variables.items() if v is not None},
            "map_count": (("key_distance", "query_distance"), count[0].reshape(shape[1:])),
            "alpha_pos": ("head", fit[:, 0]),
            "beta_pos": ("head", fit[:, 1]),
            "sigma2_pos": ("head", fit[:, 2]),
        },
        coords={
            "query_bucket": lay.buckets,
            "tau": ("query_bucket", pairs.tau),
            "n_queries": ("query_bucket", counts),
            "n_pairs": ("query_bucket", pairs.valid.sum(1)),
            "n_admissible_pairs": ("query_bucket", pairs.n_admissible),
            "bucket_weight": ("query_bucket", bucket_weights(width, counts, opt)),
            "in_first20": ("query_bucket", first20),
            "in_last20": ("query_bucket", last20),
            "context_bin": np.arange(opt.context_bins),
            "context_lo": ("context_bin", np.linspace(0, 1, opt.context_bins + 1)[:-1]),
            "context_hi": ("context_bin", np.linspace(0, 1, opt.context_bins + 1)[1:]),
            "key_distance": centers,
            "query_distance": centers,
        },
    )
    ds["ap"].attrs["meaning"] = "mean Gaussian closed-form pairwise plasticity 4 Phi(z) Phi(-z) over key pairs (eqs. 4.11-4.14)"
    if mc:
        ds["ap_mc"].attrs["meaning"] = "mean empirical 4 p (1-p) from the bucket's captured queries, same key pairs"
        ds["ap_mc_se"].attrs["meaning"] = (
            "Monte Carlo standard error of ap_mc over the key-pair draw (weighted sd / sqrt(n) over pairs); the "
            "pairs share the bucket's queries, so query-sampling error is not included")
    ds.attrs["pair_weight"] = opt.pair_weight
    return ds


#: The variances :func:`pair_statistics` returns, by name: ``(covariance, positional_fit)`` of the query model.
PAIR_VARIANCES = {"v_diag": ("diagonal", None), "v_full": ("full", None), "v_indep": ("full", "per_bucket"),
                  "v_joint": ("joint", "per_bucket")}


def pair_statistics(capture: xr.Dataset, heads=None, options: AnalysisOptions | None = None,
                    variances=tuple(PAIR_VARIANCES), **overrides) -> xr.Dataset:
    """The closed form's terms for every key pair of selected heads, for the theory pages.

    Parameters
    ----------
    heads : int, slice or sequence of int, optional
        Positions along ``head`` (all when None).
    variances : sequence of str
        Which of :data:`PAIR_VARIANCES` to return (all by default); the one of the options' covariance is always
        there (``pp``, ``gamma`` and ``z0`` rest on it). A full covariance's quadratic form of every pair is the
        costly part: a reader of the diagonal one alone skips the others.

    Returns
    -------
    xarray.Dataset
        Dims ``head, query_bucket, pair``: ``delta1`` (positional coordinate
        difference of the two keys in the Householder basis), ``mu`` (eq. 4.11),
        ``v_diag`` (eq. 4.12), ``v_full`` (Lemma A.1's proof), ``v_indep`` and
        ``v_joint`` (both from the bucket's own moments of all d coordinates:
        ``v_indep`` sets the covariance between the positional coordinate and
        the semantic ones to zero as assumption A.1-A.2 does, ``v_joint`` keeps
        it, so ``v_joint / v_indep`` isolates that assumption), ``pp`` (with the
        options' covariance), ``gamma = delta1 beta_pos / sqrt(v)`` and
        ``z0 = (mu - delta1 beta_pos tau) / sqrt(v)`` of Lemma A.2 (with the
        options' variance), ``key_distance``, ``query_distance``, ``valid``.
        Per head: ``alpha_pos``, ``beta_pos``, ``sigma2_pos``.
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    capture = analysis_vectors(capture, opt)
    dev = resolve_device(opt.device)
    sub = capture if heads is None else capture.isel(head=np.atleast_1d(np.arange(capture.sizes["head"])[heads]))
    lay = pair_plan(sub, opt, dev, warn=False)
    q, k = as_f64(sub["q"], dev), as_f64(sub["k"], dev)
    _, qr, kr = rotate(q, k, lay.t)
    model = query_model(qr, lay.t, lay.onehot, lay.tau, opt)
    delta = kr[:, lay.pi] - kr[:, lay.pj]  # [head, bucket, pair, dim]: every term is returned, so formed once
    pp = closed_form_kernel(delta, model)
    own = {"diagonal": "v_diag", "full": "v_full", "joint": "v_joint"}[opt.covariance]
    unknown = set(variances) - set(PAIR_VARIANCES)
    if unknown:
        raise ValueError(f"unknown variances {sorted(unknown)}: choose from {list(PAIR_VARIANCES)}")
    variants = {}
    for name, (cov, fit) in PAIR_VARIANCES.items():
        if name not in variances and name != own:
            continue
        m = query_model(qr, lay.t, lay.onehot, lay.tau,
                        AnalysisOptions.from_kwargs(opt, covariance=cov, positional_fit=fit or opt.positional_fit,
                                                    semantic_stats="per_bucket"))
        if m.full:
            variants[name] = torch.einsum("hbpd,hbde,hbpe->hbp", delta, m.cov, delta)
        else:
            variants[name] = torch.einsum("hbpd,hbd->hbp", delta * delta, m.cov)
    v = variants[own]
    mu = torch.einsum("hbpd,hbd->hbp", delta, model.mean)
    d1 = delta[..., 0]
    sd = torch.sqrt(v)
    gamma = d1 * model.beta_pos[:, None, None] / sd
    z0 = (mu - d1 * model.beta_pos[:, None, None] * lay.tau[None, :, None]) / sd
    valid = lay.pvalid.expand_as(pp)
    pos = sub["position"].values.astype(float)
    pairs = lay.pairs
    nan = lambda x: np.where(to_numpy(valid), to_numpy(x), np.nan)  # noqa: E731
    dims = ("head", "query_bucket", "pair")
    out = xr.Dataset(
        {
            "delta1": (dims, nan(d1)), "mu": (dims, nan(mu)), "pp": (dims, nan(pp)),
            **{name: (dims, nan(v)) for name, v in variants.items()},
            "gamma": (dims, nan(gamma)), "z0": (dims, nan(z0)),
            "valid": (dims, to_numpy(valid)),
            "key_distance": (("query_bucket", "pair"), np.abs(pos[pairs.i] - pos[pairs.j])),
            "query_distance": (("query_bucket", "pair"), pairs.tau[:, None] - 0.5 * (pos[pairs.i] + pos[pairs.j])),
            "alpha_pos": ("head", to_numpy(model.alpha_pos)), "beta_pos": ("head", to_numpy(model.beta_pos)),
            "sigma2_pos": ("head", to_numpy(model.sigma2_pos)),
        },
        coords={"query_bucket": lay.buckets, "tau": ("query_bucket", pairs.tau),
                **{c: ("head", sub[c].values) for c in ("layer", "q_head", "kv_head", "rope")}},
    )
    out.attrs["options"] = opt.to_dict()
    return out


def effective_pairs(capture: xr.Dataset, options: AnalysisOptions | None = None, **overrides) -> xr.Dataset:
    """Kish's effective number of key pairs, ``(sum w)^2 / sum w^2``, per query bucket and per edge region.

    With ``pair_weight="prefix"`` (Definition 4.3's weighting) a few pairs of early keys carry most of the
    weight, so a bucket's average rests on far fewer pairs than it draws; with uniform weights the effective
    number is the number of pairs. Returns ``n_pairs`` and ``n_effective`` (dim ``query_bucket``) and
    ``first20``/``last20`` (the effective pairs of the regions ``ap_first20``/``ap_last20`` average, summed
    over their buckets) in the attrs.
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    lay = pair_plan(capture, opt, torch.device("cpu"), warn=False)
    w = to_numpy(lay.pweight)  # [bucket, pair]
    s1, s2 = w.sum(-1), (w * w).sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        n_eff = np.where(s2 > 0, s1 * s1 / s2, 0.0)
    first, last = edge_masks(lay.pairs.tau, int(capture.attrs["seq_len"]), opt)
    ok = ~np.isnan(n_eff)
    return xr.Dataset({"n_pairs": ("query_bucket", (w > 0).sum(-1)), "n_effective": ("query_bucket", n_eff)},
                      coords={"query_bucket": lay.buckets},
                      attrs={"pair_weight": opt.pair_weight, "first20": float(n_eff[first & ok].sum()),
                             "last20": float(n_eff[last & ok].sum())})

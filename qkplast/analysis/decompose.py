"""Drift versus content: an exact four-part decomposition of AP_drop (beyond the thesis, 7.1.2 and 7.6).

The thesis attributes the AP_drop left after bias collapse to "content signal
decay" without measuring it. The fitted model of eqs. 4.10-4.12 gives the
score difference ``D = q^T delta`` of a key pair ``delta = k_i - k_j`` in query
bucket ``b`` the mean ``m_b^T delta`` and the variance ``delta^T Sigma_b delta``.
Everything in it that moves with position is a *mean drift*, and it has two
sources:

* the queries: the linear drift of eq. 4.10, which the Householder basis puts
  on coordinate 1, ``m_b,1 = alpha_pos + beta_pos tau_b``;
* the keys: their own linear drift ``beta_K`` (the slope of the keys over
  position, in every coordinate, the drift axis or not), which makes
  ``delta = beta_K (t_i - t_j) + (r_i - r_j)`` with ``r`` the keys' residual.

Everything else is *content*: the query statistics of each bucket around that
drift (the semantic means ``mu_b``, every variance, ``sigma_pos^2`` included)
and the keys' residual differences ``r_i - r_j``. Two switches give four
counterfactual models of each bucket, evaluated on the bucket's own key pairs
with the closed form (eq. 4.14) and averaged with the estimator's pair weights:

* ``P`` (drift): 1 keeps both drifts; 0 removes them: the query mean is held at
  its context average level along the drift (``beta_pos (tau_b - tau_bar)``
  taken out of ``m_b``) and the keys lose their drift
  (``delta -> delta - beta_K (t_i - t_j)``);
* ``C`` (content statistics): 1 uses the bucket's own statistics; 0 holds them
  at their context average (the query-count-weighted mean over usable buckets
  of the drift-free mean ``m_b - beta_pos (tau_b - tau_bar) e_1`` and of
  ``Sigma_b``).

With ``Drop(P, C)`` the first-minus-last difference of the resulting profile
(the edge rule of ``ap_drop``), ``Drop(1, 1) = ap_drop`` and the 2 x 2
factorial parts

    ap_drop_baseline    = Drop(0, 0)                                 neither drift nor changing content
    ap_drop_bias        = Drop(1, 0) - Drop(0, 0)                    the drifts alone, content held fixed
    ap_drop_content     = Drop(0, 1) - Drop(0, 0)                    the content statistics' change alone
    ap_drop_interaction = Drop(1, 1) - Drop(1, 0) - Drop(0, 1) + Drop(0, 0)

add up to ``ap_drop`` exactly. The baseline is what the first and last regions
differ by with no drift and fixed content: their key pairs are drawn from
different key sets (the last region's from more, farther apart keys), so it is
near 0 when the keys' residual differences do not change with distance.

``ap_drop_keys`` of earlier versions (``Drop(0, 0)`` of a decomposition whose
positional part held only the query's drift axis, so that key drift off that
axis fell into content) has no counterpart here and is gone; the part it was
closest to is ``ap_drop_baseline``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr

from qkplast.tensors import (SCRATCH_CPU_MB, auto_chunk, head_vectors, map_head_chunks, matmul, resolve_device,
                            scratch, to_numpy)
from qkplast.analysis.moments import cloud_moments
from qkplast.analysis.pairs import pair_plan
from qkplast.analysis.plasticity import (QueryModel, bytes_per_head, edge_masks, pair_kernel, pairwise_plasticity,
                                         rotated_clouds, weighted_pair_mean, weighted_square_sums)
from qkplast.analysis.vectors import analysis_vectors
from qkplast.options import AnalysisOptions

#: counterfactual (P, C) switches, in the order of the ``variant`` axis
VARIANTS = ((1, 1), (1, 0), (0, 1), (0, 0))
#: the decomposition's terms ("parts" in the pages), in the order they are reported; they add up to ap_drop
TERMS = ("ap_drop_baseline", "ap_drop_bias", "ap_drop_content", "ap_drop_interaction")
MEANING = {
    "ap_drop_baseline": "Drop(P=0,C=0): no drift of queries or keys, content statistics at their context average",
    "ap_drop_bias": "Drop(1,0) - Drop(0,0): the mean drifts of queries and keys with position alone, content fixed",
    "ap_drop_content": "Drop(0,1) - Drop(0,0): the change of the content statistics across buckets alone, no drift",
    "ap_drop_interaction": "Drop(1,1) - Drop(1,0) - Drop(0,1) + Drop(0,0)",
}


# --------------------------------------------------------------------------- counterfactual models


@dataclass
class Counterfactuals:
    """The three counterfactual models of a chunk of heads besides the fitted one (Householder basis).

    ``mean`` ``[variant, head, bucket, dim]`` for variants (1,0), (0,1), (0,0); ``cov_bucket`` is the fitted
    ``Sigma_b`` and ``cov_average`` its context average (``[head, dim]`` diagonal or ``[head, dim, dim]``
    full); ``key_drift`` ``[head, dim]`` is ``H beta_K``; ``dt`` ``[bucket, pair]`` the pairs' position
    differences ``t_i - t_j``; ``weight`` ``[bucket, pair]`` the estimator's pair weights.
    """

    mean: torch.Tensor
    cov_bucket: torch.Tensor
    cov_average: torch.Tensor
    full: bool
    key_drift: torch.Tensor
    dt: torch.Tensor
    weight: torch.Tensor

    def __call__(self, delta: torch.Tensor, sl: slice) -> torch.Tensor:
        """The three variants' means and variances ``[head, bucket, pair, 6]`` (``mu10, var10, mu01, var01, mu00,
        var00``) for a block of heads; :meth:`from_terms` turns them, for the whole chunk at once, into plasticity.

        ``delta`` ``[head, bucket, pair, dim]`` holds the block's key differences (rows ``sl`` of the chunk).
        """
        mean, g = self.mean[:, sl], self.key_drift[sl]
        cov_b, cov_a = self.cov_bucket[sl], self.cov_average[sl]
        # keys without their drift: delta - (t_i - t_j) H beta_K, one pass into a scratch buffer
        nodrift = torch.addcmul(delta, self.dt[None, :, :, None], g[:, None, None, :], value=-1.0,
                                out=scratch("delta_no_drift", tuple(delta.shape), delta))
        # one matrix-vector product per mean: with two columns at once BLAS takes a general product, about
        # twice the time of two matrix-vector products here
        mu10 = matmul(delta, mean[0][..., None])[..., 0]  # [head, bucket, pair]
        mu01, mu00 = (matmul(nodrift, mean[v][..., None])[..., 0] for v in (1, 2))  # [head, bucket, pair] each
        if self.full:
            var10 = torch.einsum("hbpd,hde,hbpe->hbp", delta, cov_a, delta)  # Lemma A.1 variance
            var01 = torch.einsum("hbpd,hbde,hbpe->hbp", nodrift, cov_b, nodrift)
            var00 = torch.einsum("hbpd,hde,hbpe->hbp", nodrift, cov_a, nodrift)
        else:
            cov_a = cov_a[:, None].expand_as(cov_b)  # [head, bucket, dim]
            var10 = weighted_square_sums(delta, cov_a)  # [head, bucket, pair], no temporary of delta's size
            square = nodrift.mul_(nodrift)  # nodrift is not needed after this
            var01, var00 = (matmul(square, c[..., None])[..., 0] for c in (cov_b, cov_a))  # [head, bucket, pair]
        return torch.stack([mu10, var10, mu01, var01, mu00, var00], -1)

    def pair_inputs(self, sl: slice) -> tuple[torch.Tensor, ...]:
        """What :func:`qkplast.analysis.compiled.pair_terms` needs to give a block's terms (diagonal covariance):
        ``means`` and ``weights`` ``[head, bucket, 1, dim]`` of ``delta`` (the variant (1,0)), the key drift
        ``[head, dim]``, and ``drift_means``, ``drift_weights`` ``[head, bucket, 2, dim]`` of the keys without
        it (the variants (0,1) and (0,0)); rows ``sl`` of the chunk."""
        mean, cov_b = self.mean[:, sl], self.cov_bucket[sl]  # [variant, head, bucket, dim], [head, bucket, dim]
        cov_a = self.cov_average[sl][:, None].expand_as(cov_b)  # [head, bucket, dim]
        return (mean[0][:, :, None], cov_a[:, :, None], self.key_drift[sl], torch.stack([mean[1], mean[2]], 2),
                torch.stack([cov_b, cov_a], 2))

    def from_terms(self, terms: torch.Tensor) -> torch.Tensor:
        """The variants' weighted mean plasticity per bucket ``[head, bucket, 3]`` from their means and variances
        ``[head, bucket, pair, 6]`` (as :meth:`__call__` returns them; eqs. 4.11-4.14), in one pass over a chunk."""
        mu, var = terms[..., 0::2].movedim(-1, 0), terms[..., 1::2].movedim(-1, 0)  # [variant, head, bucket, pair]
        return weighted_pair_mean(pairwise_plasticity(mu, var), self.weight).movedim(0, -1)  # [head, bucket, 3]


def counterfactuals(model: QueryModel, key_slope: torch.Tensor, lay, usable: torch.Tensor) -> Counterfactuals:
    """The counterfactual models of :mod:`this module <qkplast.analysis.decompose>` for a chunk of heads.

    Parameters
    ----------
    model : QueryModel
        The fitted query model in the Householder basis (coordinate 1 carries the query drift).
    key_slope : Tensor ``[head, dim]``
        ``H beta_K``, the keys' slope over position in the same basis.
    lay
        The plasticity layout (:func:`qkplast.analysis.pairs.pair_plan`): ``tau``, pairs,
        positions and pair weights.
    usable : Tensor ``[bucket]``
        Query counts of the buckets with statistics (0 for the others): the weights of the context average.
    """
    w = usable / usable.sum()  # [bucket]
    tau_bar = (w * lay.tau).sum()
    drift = model.beta_pos[:, None] * (lay.tau - tau_bar)  # [head, bucket] query drift about its average level
    mean = torch.nan_to_num(model.mean)
    avg = torch.einsum("b,hbd->hd", w, mean)  # [head, dim] context-average mean (drift at its average level)
    e1_drift = torch.zeros_like(mean)
    e1_drift[..., 0] = drift
    means = torch.stack([avg[:, None] + e1_drift,  # (1,0): the drift on the average content
                         mean - e1_drift,  # (0,1): the bucket's own content, no drift
                         avg[:, None].expand_as(mean)])  # (0,0)
    cov = torch.nan_to_num(model.cov)
    cov_avg = torch.einsum("b,hb...->h...", w, cov)
    dt = lay.t[lay.pi] - lay.t[lay.pj]  # [bucket, pair]
    return Counterfactuals(means, cov, cov_avg, model.full, key_slope, dt, lay.pweight)


# --------------------------------------------------------------------------- parts


def drop_of(ap: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """First-minus-last mean over buckets (NaN buckets left out), as ``ap_drop``: ``[..., bucket] -> [...]``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.where(first, ap, np.nan), -1) - np.nanmean(np.where(last, ap, np.nan), -1)


def terms_from_drops(drops: np.ndarray, ap_drop: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The four parts from ``Drop(P, C)`` ``[variant, ...]`` (order :data:`VARIANTS`).

    ``ap_drop`` (default ``Drop(1, 1)``) is the total the parts add up to: the interaction takes what
    differs between it and ``Drop(1, 1)`` (rounding, when both come from the same fit).
    """
    d11, d10, d01, d00 = drops
    total = d11 if ap_drop is None else ap_drop
    bias, content = d10 - d00, d01 - d00
    return {"ap_drop_baseline": d00, "ap_drop_bias": bias, "ap_drop_content": content,
            "ap_drop_interaction": total - d00 - bias - content}


def decomposition_dataset(profiles: np.ndarray, tau: np.ndarray, buckets: np.ndarray, seq_len: int,
                          opt: AnalysisOptions, ap_drop: np.ndarray | None = None) -> xr.Dataset:
    """The parts (dim ``head``) and ``ap_counterfactual`` (``head, query_bucket, variant``) from the four
    counterfactual profiles ``[variant, head, bucket]`` (order :data:`VARIANTS`)."""
    first, last = edge_masks(tau, seq_len, opt)
    parts = terms_from_drops(drop_of(profiles, first, last), ap_drop)
    ds = xr.Dataset({name: ("head", parts[name]) for name in TERMS})
    for name in TERMS:
        ds[name].attrs["meaning"] = MEANING[name]
    ds["ap_counterfactual"] = xr.DataArray(
        np.moveaxis(profiles, 0, -1), dims=("head", "query_bucket", "variant"),
        coords={"variant": [f"P{p}C{c}" for p, c in VARIANTS], "query_bucket": buckets, "tau": ("query_bucket", tau)})
    return ds


def counterfactual_ap(capture: xr.Dataset, options: AnalysisOptions | None = None, pairs=None, **overrides) -> xr.DataArray:
    """Counterfactual closed-form profiles ``[variant, head, query_bucket]`` (see the module docstring).

    ``variant`` is labelled ``"P1C1"``, ``"P1C0"``, ``"P0C1"``, ``"P0C0"``; ``P1C1`` is ``ap`` itself. One
    pass over the heads: the closed form only (no Monte Carlo, no maps), the three counterfactual variants
    evaluated on each block of key differences while it is in cache. ``pairs``
    (:class:`~qkplast.analysis.pairs.KeyPairs`) replace the drawn ones (see
    :func:`qkplast.analysis.pairs.pairs_without`).
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    capture = analysis_vectors(capture, opt)  # head_dims, query_scale (identity under the defaults)
    dev = resolve_device(opt.device)
    lay = pair_plan(capture, opt, dev, warn=False, pairs=pairs)
    usable = usable_counts(lay, opt, dev)

    def one_chunk(sl: slice) -> torch.Tensor:
        m = cloud_moments(*head_vectors(capture, sl, dev), lay.t, scatter=False)
        rot = rotated_clouds(m, lay, opt)
        cf = counterfactuals(rot.model, rot.key_slope, lay, usable)
        pp, _, variants = pair_kernel(rot.qr, rot.kr, lay.pi, lay.pj, rot.model, lay.qidx, lay.qmask,
                                      monte_carlo=False, block_hook=cf)
        return torch.cat([weighted_pair_mean(pp, lay.pweight)[..., None], variants], -1)  # [head, bucket, 4]

    chunk = opt.head_chunk or auto_chunk(bytes_per_head(lay, capture.sizes["dim"], opt, False, dev), dev, SCRATCH_CPU_MB)
    prof = np.moveaxis(to_numpy(torch.cat(map_head_chunks(one_chunk, capture.sizes["head"], chunk, dev))), -1, 0)
    return xr.DataArray(prof, dims=("variant", "head", "query_bucket"),
                        coords={"variant": [f"P{p}C{c}" for p, c in VARIANTS], "query_bucket": lay.buckets,
                                "tau": ("query_bucket", to_numpy(lay.tau))})


def usable_counts(lay, opt: AnalysisOptions, dev: torch.device) -> torch.Tensor:
    """Query counts of the buckets with statistics, 0 for the others ``[bucket]``: the context-average weights."""
    counts = np.where((lay.counts >= opt.min_bucket_samples) & (lay.counts > 0), lay.counts, 0)
    return torch.as_tensor(counts, device=dev, dtype=torch.float64)


def decompose_drop(capture: xr.Dataset, options: AnalysisOptions | None = None, ap_drop: np.ndarray | None = None,
                   pairs=None, **overrides) -> xr.Dataset:
    """``ap_drop_baseline``, ``ap_drop_bias``, ``ap_drop_content`` and ``ap_drop_interaction``, summing to ``ap_drop``.

    Parameters
    ----------
    capture : xarray.Dataset
    options : AnalysisOptions, optional
    ap_drop : array ``[head]``, optional
        The total to decompose (``analyze``'s ``ap_drop``); default: the
        counterfactual ``Drop(1, 1)``, which is the same number recomputed.

    Returns
    -------
    xarray.Dataset
        The four parts (dim ``head``) and ``ap_counterfactual`` (``head, query_bucket, variant``),
        the counterfactual profiles. :func:`qkplast.analyze` computes the same in its own pass over the heads.
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    cf = counterfactual_ap(capture, opt, pairs)
    return decomposition_dataset(cf.values, cf.tau.values, cf.query_bucket.values, int(capture.attrs["seq_len"]),
                                 opt, None if ap_drop is None else np.asarray(ap_drop, float))


def model_level_terms(capture: xr.Dataset, options: AnalysisOptions | None = None, pairs=None) -> dict[str, float]:
    """``ap_drop`` and its four parts as means over heads (NaN heads left out): the model-level quantities
    that :mod:`qkplast.stats` puts intervals on (``pairs``: as for :func:`counterfactual_ap`)."""
    d = decompose_drop(capture, options, pairs=pairs)
    cf = d.ap_counterfactual.sel(variant="P1C1").values  # [head, bucket]
    first, last = edge_masks(d.tau.values, int(capture.attrs["seq_len"]), options or AnalysisOptions())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = {"ap_drop": float(np.nanmean(drop_of(cf, first, last)))}
        out.update({name: float(np.nanmean(d[name].values)) for name in TERMS})
    return out


# --------------------------------------------------------------------------- many cuts of one capture at once


def counterfactual_ap_of_cuts(capture: xr.Dataset, cuts, options: AnalysisOptions | None = None, pairs=None,
                              buckets=None) -> np.ndarray:
    """:func:`counterfactual_ap` of many cuts of one capture at once: ``[variant, cut, head, query_bucket]``.

    Parameters
    ----------
    cuts : sequence of boolean masks ``[sample]`` or of sample indices
        The cuts; cut ``c`` is analysed as ``capture.isel(sample=np.flatnonzero(cuts[c]))`` alone would be.
    pairs : list of KeyPairs or None, optional
        Each cut's key pairs (as :func:`counterfactual_ap`'s ``pairs``); default (or None in the list): drawn on the
        cut.
    buckets : array of int, optional
        The buckets to evaluate (default: all); the others are NaN.

    The cuts and heads are batched as units ``(cut, head)`` (:mod:`qkplast.analysis.cuts`): each unit's moments,
    Householder basis, query model and counterfactual profiles in one pass over chunks of units, its cut's pairs
    gathered per unit. The values are :func:`counterfactual_ap`'s on each cut, up to the order of floating-point
    sums. Options the batched kernels do not reproduce (:func:`qkplast.analysis.cuts.supports`) are analysed cut
    by cut.
    """
    from qkplast.analysis.cuts import (counterfactual_pair_profiles, cut_plan, gather_units, keeps_of, map_units,
                                       padded_source, supports, unit_chunk, unit_clouds)
    from qkplast.analysis.pairs import bucket_positions

    opt = AnalysisOptions.from_kwargs(options)
    capture = analysis_vectors(capture, opt)  # head_dims, query_scale (identity under the defaults)
    keeps = keeps_of(capture, cuts)
    n_cut, n_head = keeps.shape[0], capture.sizes["head"]
    pairs = [None] * n_cut if pairs is None else list(pairs)
    n_bucket = len(bucket_positions(capture, opt.query_position)[0])
    buckets = np.arange(n_bucket) if buckets is None else np.asarray(buckets, dtype=np.int64)
    out = np.full((len(VARIANTS), n_cut, n_head, n_bucket), np.nan)
    if not supports(opt):  # a loop of per-cut analyses
        for c, keep in enumerate(keeps):
            cf = counterfactual_ap(capture.isel(sample=np.flatnonzero(keep)), opt, pairs[c])
            out[:, c][..., buckets] = cf.values[..., buckets]
        return out
    dev = resolve_device(opt.device)
    plan = cut_plan(capture, keeps, opt, dev, pairs, buckets)
    if not len(plan.pair_buckets):  # no bucket of any cut has a weighted pair: every profile is NaN
        return out
    q, k = (padded_source(capture[name].values, dev) for name in ("q", "k"))  # [head, sample + 1, dim] float64

    def one_chunk(sl: slice) -> torch.Tensor:
        unit = torch.arange(sl.start, sl.stop, device=dev)
        cut, head = unit // n_head, unit % n_head  # [unit] each
        clouds = unit_clouds(*gather_units(q, k, plan, cut, head, head), plan, cut)
        return counterfactual_pair_profiles(clouds, plan, cut)  # [unit, pair_bucket, variant]

    chunk = unit_chunk(plan, capture.sizes["dim"], opt, dev)
    prof = to_numpy(torch.cat(map_units(one_chunk, n_cut * n_head, chunk, dev)))  # [cut * head, pair_bucket, variant]
    out[..., plan.pair_buckets] = np.moveaxis(prof, -1, 0).reshape(len(VARIANTS), n_cut, n_head, -1)
    return out


def edge_buckets(capture: xr.Dataset, opt: AnalysisOptions) -> np.ndarray | None:
    """The buckets ``ap_drop`` and its parts read (the first and last ``edge_fraction``), when every cut of the
    capture has the same ones (midpoint positions, or the bucket-index rule); None otherwise."""
    from qkplast.analysis.pairs import bucket_positions

    if opt.query_position != "midpoint" and opt.edge_rule == "position":
        return None
    _, tau, _, _ = bucket_positions(capture, opt.query_position)
    first, last = edge_masks(tau, int(capture.attrs["seq_len"]), opt)
    return np.flatnonzero(first | last)


def model_level_terms_of_cuts(capture: xr.Dataset, cuts, options: AnalysisOptions | None = None,
                              pairs=None) -> np.ndarray:
    """:func:`model_level_terms` of many cuts of one capture at once: ``[cut, quantity]`` (``ap_drop`` and
    :data:`TERMS`, the order of :func:`model_level_terms`'s dict).

    Only the buckets of the first and last ``edge_fraction`` enter ``ap_drop`` and its parts, so only their pairs
    are evaluated (:func:`counterfactual_ap_of_cuts` with ``buckets``): the other buckets' profiles would be
    computed and never read. ``cuts`` and ``pairs`` as for :func:`counterfactual_ap_of_cuts`.
    """
    from qkplast.analysis.pairs import bucket_positions

    opt = AnalysisOptions.from_kwargs(options)
    prof = counterfactual_ap_of_cuts(capture, cuts, opt, pairs, edge_buckets(capture, opt))  # [variant, cut, head, bucket]
    seq_len = int(capture.attrs["seq_len"])
    midpoint = bucket_positions(capture, "midpoint")[1]  # every cut's tau unless it is the queries' mean position
    return np.array([_terms_of_profiles(prof[:, c], midpoint if opt.query_position == "midpoint" else
                                        _cut_tau(capture, cuts[c], opt), seq_len, opt) for c in range(prof.shape[1])])


def _cut_tau(capture: xr.Dataset, cut, opt: AnalysisOptions) -> np.ndarray:
    """The representative positions of a cut's buckets (``query_position="mean"`` depends on the cut's samples)."""
    from qkplast.analysis.cuts import keeps_of, sample_view
    from qkplast.analysis.pairs import bucket_positions

    keep = keeps_of(capture, [cut])[0]
    return bucket_positions(sample_view(capture).isel(sample=np.flatnonzero(keep)), opt.query_position)[1]


def _terms_of_profiles(profiles: np.ndarray, tau: np.ndarray, seq_len: int, opt: AnalysisOptions) -> list[float]:
    """``ap_drop`` and its parts as means over heads from the counterfactual profiles ``[variant, head, bucket]``, as
    :func:`model_level_terms` forms them (:func:`decomposition_dataset`'s parts, ``Drop(1, 1)`` for ``ap_drop``)."""
    first, last = edge_masks(tau, seq_len, opt)
    drops = drop_of(profiles, first, last)  # [variant, head]
    parts = terms_from_drops(drops, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return [float(np.nanmean(drops[0]))] + [float(np.nanmean(parts[name])) for name in TERMS]


class ModelLevelTerms:
    """:func:`model_level_terms` as a statistic of :func:`qkplast.stats.bootstrap.document_interval`: a callable on
    one capture (``statistic(capture, pairs=None) -> [quantity]``) that also analyses many cuts of one capture at
    once (``statistic.of_cuts(capture, cuts, pairs) -> [cut, quantity]``, :func:`model_level_terms_of_cuts`).

    ``names`` selects and orders the quantities (default: ``ap_drop`` and :data:`TERMS`).
    """

    QUANTITIES = ("ap_drop",) + TERMS

    def __init__(self, options: AnalysisOptions | None = None, names=None):
        self.options = options or AnalysisOptions()
        self.names = tuple(names or self.QUANTITIES)
        self._at = [self.QUANTITIES.index(n) for n in self.names]

    def __call__(self, capture: xr.Dataset, pairs=None) -> np.ndarray:
        return self.of_cuts(capture, [np.ones(capture.sizes["sample"], dtype=bool)], [pairs])[0]

    def of_cuts(self, capture: xr.Dataset, cuts, pairs=None) -> np.ndarray:
        return model_level_terms_of_cuts(capture, cuts, self.options, pairs)[:, self._at]

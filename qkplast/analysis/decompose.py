"""Bias versus content: an exact three-part decomposition of AP_drop (beyond the thesis, 7.1.2 and 7.6).

The thesis attributes the AP_drop left after bias collapse to "content signal
decay" without measuring it. In the Householder basis of eq. 4.10 the score
difference of a key pair splits into the part carried by the positional
coordinate and the part carried by the semantic coordinates,

    D = delta_1 q_1 + delta_{2:d}^T q_{2:d},

and the fitted positional-semantic model (eqs. 4.11-4.12) gives each part a
mean and a variance per query bucket b:

    positional part   mean delta_1 (alpha_pos + beta_pos tau_b),  variance delta_1^2 sigma_pos^2
    content part      mean delta_{2:d}^T mu_b,                     variance delta_{2:d}^T Sigma_b delta_{2:d}

Two switches give four counterfactual models per bucket, each evaluated on the
bucket's own key pairs with the closed form (eq. 4.14):

* ``P`` (positional term): 1 keeps the positional part; 0 removes it (the
  query's positional coordinate contributes nothing, mean or variance);
* ``C`` (content statistics): 1 uses the bucket's own (mu_b, Sigma_b); 0 holds
  them at their context average (the query-count-weighted mean over buckets
  of mu_b and of Sigma_b, i.e. the pooled within-bucket moments).

With ``Drop(P, C)`` the first-minus-last difference of the resulting profile
(the same edge rule and averaging as ``ap_drop``), ``Drop(1, 1) = ap_drop`` and

    ap_drop_bias        = Drop(1, 0) - Drop(0, 0)   the positional term alone, content held fixed
    ap_drop_content     = Drop(0, 1)                the content statistics' change alone, no positional term
    ap_drop_interaction = ap_drop - ap_drop_bias - ap_drop_content

add up to ``ap_drop`` exactly. ``ap_drop_keys = Drop(0, 0)`` is the part of
``ap_drop_content`` that the key pairs' own semantic differences produce with the
query content held fixed (first-region and last-region buckets draw their pairs
from different key sets).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
import torch
import xarray as xr

from qkplast._torch import as_f64, auto_chunk, head_chunks, resolve_device, to_numpy
from qkplast.analysis.linalg import householder_apply, householder_vector
from qkplast.options import AnalysisOptions
from qkplast.analysis.views import analysis_vectors
from qkplast.analysis.plasticity import (KeyPairs, QueryModel, bucket_layout, closed_form_kernel, edge_masks, query_model,
                                        sample_key_pairs)
from qkplast.analysis.moments import slope

#: counterfactual (P, C) switches, in the order of the ``variant`` axis
VARIANTS = ((1, 1), (1, 0), (0, 1), (0, 0))
PARTS = ("ap_drop_bias", "ap_drop_content", "ap_drop_interaction", "ap_drop_keys")


# --------------------------------------------------------------------------- shared fitted layout


@dataclass
class Fitted:
    """Buckets and key pairs shared by all heads, as the pairwise estimator draws them."""

    buckets: np.ndarray
    tau: np.ndarray  # [bucket]
    width: np.ndarray
    counts: np.ndarray  # [bucket] captured queries
    pairs: KeyPairs
    usable: np.ndarray  # [bucket] enough queries for the statistics
    t: torch.Tensor  # [sample]
    onehot: torch.Tensor  # [bucket, sample]
    tau_t: torch.Tensor  # [bucket]
    pvalid: torch.Tensor  # [bucket, pair]


def fitted_layout(capture: xr.Dataset, opt: AnalysisOptions, dev: torch.device) -> Fitted:
    """The bucket layout and key pairs of :func:`qkplast.analysis.plasticity.plasticity` (same options, same pairs)."""
    buckets, _, width, counts = bucket_layout(capture, opt.query_position)
    pairs = sample_key_pairs(capture, opt)
    usable = (counts >= opt.min_bucket_samples) & (counts > 0)
    bucket = torch.as_tensor(capture["bucket"].values, device=dev)
    onehot = (bucket[None, :] == torch.arange(len(buckets), device=dev)[:, None]).to(torch.float64)
    pvalid = torch.as_tensor(pairs.valid & usable[:, None], device=dev)
    return Fitted(buckets, pairs.tau, width, counts, pairs, usable, as_f64(capture["position"], dev), onehot,
                  as_f64(pairs.tau, dev), pvalid)


def rotate_and_fit(q: torch.Tensor, k: torch.Tensor, fit: Fitted, opt: AnalysisOptions):
    """Householder basis of eq. 4.10 and the per-bucket query model (eqs. 4.11-4.12) for a chunk of heads.

    ``q``, ``k`` ``[head, sample, dim]``; returns rotated queries and keys and the :class:`QueryModel`.
    """
    beta = slope(q, fit.t)  # [head, dim]
    if (torch.linalg.vector_norm(beta, dim=-1) == 0).any():
        raise ValueError("a head has zero query drift (beta = 0): the Householder direction is undefined")
    u = householder_vector(beta)
    qr, kr = householder_apply(u, q), householder_apply(u, k)  # [head, sample, dim]
    return qr, kr, query_model(qr, fit.t, fit.onehot, fit.tau_t, opt)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int) -> torch.Tensor:
    """Mean of ``x`` over ``dim`` where ``mask`` holds and ``x`` is not NaN; NaN where nothing is left."""
    ok = mask & ~torch.isnan(x)
    s = torch.where(ok, x, torch.zeros_like(x)).sum(dim)
    c = ok.sum(dim)
    return torch.where(c > 0, s / c.clamp_min(1), torch.full_like(s, float("nan")))


# --------------------------------------------------------------------------- counterfactual models


def counterfactual_model(model: QueryModel, counts: torch.Tensor, positional: bool, content: bool) -> QueryModel:
    """The query model with the positional part switched off and/or the content statistics held fixed.

    Parameters
    ----------
    model : QueryModel
        Fitted model, coordinate 0 positional (Householder basis).
    counts : Tensor ``[bucket]``
        Queries per bucket: weights of the context average (buckets without
        queries get weight 0).
    positional : bool
        False zeroes the positional coordinate's mean and variance (and, for a
        full covariance, its covariances), so it adds nothing to the score difference.
    content : bool
        False replaces the semantic mean and covariance of every bucket by their
        count-weighted average over buckets.
    """
    mean, cov = model.mean.clone(), model.cov.clone()  # [head, bucket, dim], [head, bucket, dim(, dim)]
    if not content:
        w = counts / counts.sum()  # [bucket]
        ok = ~torch.isnan(mean).any(-1)  # [head, bucket]  buckets with statistics
        wm = torch.where(ok, w, torch.zeros_like(w))
        wm = wm / wm.sum(-1, keepdim=True)
        avg_mean = torch.einsum("hb,hbd->hd", wm, torch.nan_to_num(mean))
        mean[..., 1:] = avg_mean[:, None, 1:]
        if model.full:
            avg_cov = torch.einsum("hb,hbde->hde", wm, torch.nan_to_num(cov))
            cov[..., 1:, 1:] = avg_cov[:, None, 1:, 1:]
        else:
            avg_cov = torch.einsum("hb,hbd->hd", wm, torch.nan_to_num(cov))
            cov[..., 1:] = avg_cov[:, None, 1:]
    if not positional:
        mean[..., 0] = 0.0
        if model.full:
            cov[..., 0, :] = 0.0
            cov[..., :, 0] = 0.0
        else:
            cov[..., 0] = 0.0
    return replace(model, mean=mean, cov=cov)


def counterfactual_profiles(delta: torch.Tensor, model: QueryModel, counts: torch.Tensor,
                            pvalid: torch.Tensor) -> torch.Tensor:
    """Closed-form plasticity per bucket under the four (P, C) models: ``[variant, head, bucket]``.

    ``delta`` ``[head, bucket, pair, dim]`` key differences in the Householder basis.
    """
    out = []
    for positional, content in VARIANTS:
        pp = closed_form_kernel(delta, counterfactual_model(model, counts, bool(positional), bool(content)))
        out.append(masked_mean(pp, pvalid, -1))  # [head, bucket]
    return torch.stack(out)


def drop_of(ap: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    """First-minus-last mean over buckets (NaN buckets left out), as ``ap_drop``: ``[..., bucket] -> [...]``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.where(first, ap, np.nan), -1) - np.nanmean(np.where(last, ap, np.nan), -1)


def parts_from_drops(drops: np.ndarray, ap_drop: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The decomposition from ``Drop(P, C)`` ``[variant, ...]`` (order :data:`VARIANTS`).

    ``ap_drop`` (default ``Drop(1, 1)``) is the total the three parts must add up to.
    """
    d11, d10, d01, d00 = drops
    total = d11 if ap_drop is None else ap_drop
    bias, content = d10 - d00, d01
    return {"ap_drop_bias": bias, "ap_drop_content": content, "ap_drop_interaction": total - bias - content,
            "ap_drop_keys": d00}


def counterfactual_ap(capture: xr.Dataset, options: AnalysisOptions | None = None, **overrides) -> xr.DataArray:
    """Counterfactual closed-form profiles ``[variant, head, query_bucket]`` (see the module docstring).

    ``variant`` is labelled ``"P1C1"``, ``"P1C0"``, ``"P0C1"``, ``"P0C0"``; ``P1C1`` is ``ap`` itself.
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    capture = analysis_vectors(capture, opt)
    dev = resolve_device(opt.device)
    fit = fitted_layout(capture, opt, dev)
    counts = torch.as_tensor(np.where(fit.usable, fit.counts, 0), device=dev, dtype=torch.float64)
    pi, pj = torch.as_tensor(fit.pairs.i, device=dev), torch.as_tensor(fit.pairs.j, device=dev)
    dim = capture.sizes["dim"]
    per_head = 8 * len(fit.buckets) * (opt.n_pairs * dim * 3 + (dim * dim * 2 if opt.covariance != "diagonal" else 0))
    out = []
    for sl in head_chunks(capture.sizes["head"], opt.head_chunk or auto_chunk(per_head, dev)):
        q, k = as_f64(capture["q"].values[sl], dev), as_f64(capture["k"].values[sl], dev)  # [head, sample, dim]
        _, kr, model = rotate_and_fit(q, k, fit, opt)
        delta = kr[:, pi] - kr[:, pj]  # [head, bucket, pair, dim]
        out.append(counterfactual_profiles(delta, model, counts, fit.pvalid))
    prof = to_numpy(torch.cat(out, 1))
    return xr.DataArray(prof, dims=("variant", "head", "query_bucket"),
                        coords={"variant": [f"P{p}C{c}" for p, c in VARIANTS], "query_bucket": fit.buckets,
                                "tau": ("query_bucket", fit.tau)})


def decompose_drop(capture: xr.Dataset, options: AnalysisOptions | None = None, ap_drop: np.ndarray | None = None,
                   **overrides) -> xr.Dataset:
    """``ap_drop_bias``, ``ap_drop_content``, ``ap_drop_interaction`` (summing to ``ap_drop``) and ``ap_drop_keys``.

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
        the counterfactual profiles.
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    capture = analysis_vectors(capture, opt)
    cf = counterfactual_ap(capture, opt)
    first, last = edge_masks(cf.tau.values, int(capture.attrs["seq_len"]), opt)
    drops = drop_of(cf.values, first, last)  # [variant, head]
    parts = parts_from_drops(drops, None if ap_drop is None else np.asarray(ap_drop, float))
    ds = xr.Dataset({name: ("head", value) for name, value in parts.items()})
    ds["ap_counterfactual"] = cf.transpose("head", "query_bucket", "variant")
    ds["ap_drop_bias"].attrs["meaning"] = "Drop(P=1,C=0) - Drop(P=0,C=0): positional term alone, content statistics held at their context average"
    ds["ap_drop_content"].attrs["meaning"] = "Drop(P=0,C=1): change of the content statistics across buckets alone, no positional term"
    ds["ap_drop_interaction"].attrs["meaning"] = "ap_drop - ap_drop_bias - ap_drop_content"
    ds["ap_drop_keys"].attrs["meaning"] = "Drop(P=0,C=0): the key pairs' semantic differences alone (a part of ap_drop_content)"
    return ds

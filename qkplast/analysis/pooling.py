"""Pooled versus within-document query statistics (issue 9, item 8).

Definition 4.1 conditions on the prefix: the query distribution at position t
is that of one document's continuations. The estimator pools the queries of a
bucket over documents, so the per-bucket variance sigma_b^2 (eq. 4.12) also
holds the document-to-document variation of the query mean, which widens the
score distribution and raises plasticity. :func:`within_document_ap` removes
that variation: every query is replaced by its deviation from the mean of its
(document, bucket) cell plus the bucket's pooled mean, and the variances are
divided by the within-cell degrees of freedom ``n_b - G_b`` (``G_b`` the cells
of bucket b) instead of ``n_b - 1``; the positional residual of coordinate 1 is
treated the same way (``N - 2 - (G - B)`` degrees of freedom). Means, keys and
pairs are unchanged, so the difference of the two ``ap`` is the pooling alone.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import xarray as xr

from qkplast.tensors import as_f64, auto_chunk, head_chunks, resolve_device, to_numpy
from qkplast.options import AnalysisOptions
from qkplast.analysis.vectors import analysis_vectors
from qkplast.analysis.pairs import pair_plan
from qkplast.analysis.plasticity import pair_closed_form, query_model, rotate, summarize_profile, weighted_pair_mean


def within_document_queries(qr: torch.Tensor, cell: torch.Tensor, n_cell: int, bucket_of_cell: torch.Tensor,
                            onehot: torch.Tensor) -> torch.Tensor:
    """``qr`` ``[head, sample, dim]`` with each (document, bucket) cell's mean replaced by its bucket's mean."""
    cell_hot = (cell[None] == torch.arange(n_cell, device=qr.device)[:, None]).to(qr.dtype)  # [cell, sample]
    cell_mean = torch.einsum("cs,hsd->hcd", cell_hot, qr) / cell_hot.sum(1).clamp_min(1)[:, None]
    bucket_mean = torch.einsum("bs,hsd->hbd", onehot, qr) / onehot.sum(1).clamp_min(1)[:, None]
    return qr - cell_mean[:, cell] + bucket_mean[:, bucket_of_cell[cell]]  # [head, sample, dim]


def within_document_ap(capture: xr.Dataset, options: AnalysisOptions | None = None, **overrides) -> xr.Dataset:
    """Closed-form ``ap`` per head and bucket with pooled and with within-document query statistics.

    Returns
    -------
    xarray.Dataset
        ``ap_pooled`` (the analysis's ``ap``), ``ap_within`` and
        ``pooling_excess = ap_pooled - ap_within`` (dims ``head, query_bucket``);
        the aggregates ``ap_overall``, ``ap_first20``, ``ap_last20``, ``ap_drop``
        of each with suffix ``_pooled`` / ``_within`` (dim ``head``); the
        variance ratio ``within_variance_share`` (mean over coordinates 2..d of
        within / pooled variance, dims ``head, query_bucket``).
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    capture = analysis_vectors(capture, opt)
    if opt.semantic_stats != "per_bucket":
        raise ValueError("within-document statistics are per bucket: use semantic_stats='per_bucket'")
    dev = resolve_device(opt.device)
    lay = pair_plan(capture, opt, dev, warn=False)
    _, doc = np.unique(capture["doc"].values, return_inverse=True)
    n_bucket = len(lay.buckets)
    cell_np = doc * n_bucket + capture["bucket"].values
    cells, cell_np = np.unique(cell_np, return_inverse=True)
    cell = torch.as_tensor(cell_np, device=dev)
    bucket_of_cell = torch.as_tensor(cells % n_bucket, device=dev)
    g_b = torch.as_tensor(np.bincount(cells % n_bucket, minlength=n_bucket), device=dev, dtype=torch.float64)
    n_b = lay.onehot.sum(1)
    dof = torch.where(n_b - g_b > 0, (n_b - 1) / (n_b - g_b).clamp_min(1), torch.full_like(n_b, float("nan")))
    n_all = float(capture.sizes["sample"])
    dof_pos = (n_all - 2) / (n_all - 2 - (len(cells) - int((lay.counts > 0).sum())))
    pooled, within, share = [], [], []
    per_head = 8 * n_bucket * lay.pi.shape[1] * 3 * capture.sizes["dim"]
    for sl in head_chunks(capture.sizes["head"], opt.head_chunk or auto_chunk(per_head, dev)):
        _, qr, kr = rotate(as_f64(capture["q"].values[sl], dev), as_f64(capture["k"].values[sl], dev), lay.t)
        m_pool = query_model(qr, lay.t, lay.onehot, lay.tau, opt)
        m_in = query_model(within_document_queries(qr, cell, len(cells), bucket_of_cell, lay.onehot), lay.t,
                           lay.onehot, lay.tau, opt)
        scale = dof[None, :, None, None] if m_in.full else dof[None, :, None]
        m_in.cov = m_in.cov * scale
        if opt.positional_fit == "global":  # coordinate 1's variance is the positional residual's
            if m_in.full:
                m_in.cov[..., 0, 0] = m_in.sigma2_pos[:, None] * dof_pos
            else:
                m_in.cov[..., 0] = m_in.sigma2_pos[:, None] * dof_pos
        pooled.append(weighted_pair_mean(pair_closed_form(kr, lay.pi, lay.pj, m_pool), lay.pweight))
        within.append(weighted_pair_mean(pair_closed_form(kr, lay.pi, lay.pj, m_in), lay.pweight))
        var_p = torch.diagonal(m_pool.cov, dim1=-2, dim2=-1) if m_pool.full else m_pool.cov
        var_w = torch.diagonal(m_in.cov, dim1=-2, dim2=-1) if m_in.full else m_in.cov
        share.append((var_w[..., 1:] / var_p[..., 1:]).mean(-1))
    ap_p, ap_w = to_numpy(torch.cat(pooled)), to_numpy(torch.cat(within))
    seq_len = int(capture.attrs["seq_len"])
    out = {"ap_pooled": (("head", "query_bucket"), ap_p), "ap_within": (("head", "query_bucket"), ap_w),
           "pooling_excess": (("head", "query_bucket"), ap_p - ap_w),
           "within_variance_share": (("head", "query_bucket"), to_numpy(torch.cat(share)))}
    for suffix, ap in (("_pooled", ap_p), ("_within", ap_w)):
        for name, (dims, value) in summarize_profile(ap, lay.pairs.tau, lay.width, lay.counts, seq_len, opt).items():
            if name != "ap_context":
                out[name + suffix] = (dims, value)
    ds = xr.Dataset(out, coords={"query_bucket": lay.buckets, "tau": ("query_bucket", lay.pairs.tau),
                                 "n_cells": ("query_bucket", to_numpy(g_b).astype(int))})
    ds.attrs["method"] = ("within: queries centred on their (document, bucket) cell mean plus the bucket mean, "
                          "variances on n_b - G_b degrees of freedom; pooled: the analysis's statistics")
    return ds


def pooling_table(capture: xr.Dataset, names=("ap_overall", "ap_first20", "ap_last20", "ap_drop"),
                  options: AnalysisOptions | None = None, **overrides) -> tuple[pd.DataFrame, str]:
    """Means over heads of ``names`` with pooled and with within-document statistics, and a one-line reading.

    The table has one row per aggregate and the columns "pooled over documents
    (estimator)", "within documents (Definition 4.1)" and their difference; the
    line gives the median within-document share of the semantic variance and
    the mean pooling excess (:func:`within_document_ap`, read by :func:`pooling_summary`).
    """
    return pooling_summary(within_document_ap(capture, options, **overrides), names)


def pooling_summary(pool: xr.Dataset, names=("ap_overall", "ap_first20", "ap_last20", "ap_drop")
                    ) -> tuple[pd.DataFrame, str]:
    """:func:`pooling_table`'s table and line from :func:`within_document_ap`'s Dataset ``pool``."""
    table = pd.DataFrame({"pooled over documents (estimator)": [float(pool[f"{n}_pooled"].mean()) for n in names],
                          "within documents (Definition 4.1)": [float(pool[f"{n}_within"].mean()) for n in names]},
                         index=list(names))
    table["difference"] = table.iloc[:, 1] - table.iloc[:, 0]
    excess = float(np.nanmean(pool.pooling_excess))
    line = (f"within-document share of the pooled semantic variance: median "
            f"{float(np.nanmedian(pool.within_variance_share)):.2f} over (head, bucket); pooling "
            f"{'raises' if excess > 0 else 'lowers'} plasticity by {abs(excess):.4f} on average over heads and "
            f"buckets ({pool.attrs['method']})")
    return table, line

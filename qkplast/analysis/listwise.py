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

import math
import warnings

import numpy as np
import pandas as pd
import torch
import xarray as xr
from scipy.special import gammaln

from qkplast._torch import as_f64, auto_chunk, head_chunks, resolve_device, to_numpy
from qkplast.analysis.decompose import Fitted, fitted_layout, masked_mean, rotate_and_fit
from qkplast.options import AnalysisOptions
from qkplast.analysis.views import analysis_vectors
from qkplast.analysis.plasticity import PlasticityWarning, QueryModel, closed_form_kernel

WHOLE = 0  # set size code of "the document's whole eligible set"


# --------------------------------------------------------------------------- sets


def eligible_samples(capture: xr.Dataset, fit: Fitted, opt: AnalysisOptions, qb: int) -> np.ndarray:
    """Sample indices of the keys eligible for query bucket ``qb`` (``options.eligible_keys``)."""
    if opt.eligible_keys == "earlier_buckets":
        return np.flatnonzero(capture["bucket"].values < qb)
    tau = fit.tau[qb]
    return np.flatnonzero(capture["position"].values < tau) if np.isfinite(tau) else np.array([], dtype=np.int64)


def _doc_codes(capture: xr.Dataset, opt: AnalysisOptions) -> np.ndarray:
    if opt.pair_docs == "any":
        return np.zeros(capture.sizes["sample"], dtype=np.int64)
    return np.unique(capture["doc"].values, return_inverse=True)[1]


def draw_sets(capture: xr.Dataset, fit: Fitted, opt: AnalysisOptions, size: int, n_sets: int,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Key sets per query bucket: sample indices ``[bucket, set, slot]`` and a mask of used slots.

    ``size == 2`` returns the pairwise estimator's pairs; ``size == 0`` one set per
    document, its whole eligible set (padded); otherwise ``n_sets`` sets of
    ``size`` distinct keys drawn as the module docstring says. A bucket without
    an admissible set has an all-False mask.
    """
    n_bucket = len(fit.buckets)
    if size == 2:
        idx = np.stack([fit.pairs.i, fit.pairs.j], -1)  # [bucket, pair, 2]
        return idx, np.repeat(fit.pairs.valid[..., None], 2, -1)
    code = _doc_codes(capture, opt)
    per_bucket = []
    for qb in range(n_bucket):  # a loop over buckets only; sets are drawn vectorised
        elig = eligible_samples(capture, fit, opt, qb)
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
    """Scores ``[head, query, set, slot]`` from scores against every sample ``[head, query, sample]``; unused slots ``-inf``."""
    pad = torch.full(all_scores.shape[:-1] + (1,), -torch.inf, dtype=all_scores.dtype, device=all_scores.device)
    padded = torch.cat([all_scores, pad], -1)  # [head, query, sample + 1]
    return padded[:, :, torch.where(smask, idx, all_scores.shape[-1])]


# --------------------------------------------------------------------------- public


def _bucket_queries(capture: xr.Dataset, n_bucket: int):
    bucket = capture["bucket"].values
    return [np.flatnonzero(bucket == b) for b in range(n_bucket)]


def nearest_bucket_mass(qr: torch.Tensor, kr: torch.Tensor, model: QueryModel, fit: Fitted, capture: xr.Dataset,
                        opt: AnalysisOptions, members: list, eligible: list) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Softmax mass on the nearest eligible bucket's keys: positional term alone, actual scores, uniform share.

    For a query of bucket b in document d, the softmax runs over d's eligible
    keys, with scores ``/ sqrt(dim)`` as in attention. *Positional term alone*:
    the score of key i is ``(alpha_pos + beta_pos tau_b) k_i1`` (the fitted mean
    of the query's positional coordinate times the key's, Householder basis).
    *Actual*: ``q^T k_i`` of the captured query. *Uniform share*: the fraction of
    the eligible keys that lie in the nearest bucket (the mass under equal scores).
    Returns ``[head, bucket]``, ``[head, bucket]``, ``[bucket]`` (means over the bucket's queries).
    """
    dim, dev = qr.shape[-1], qr.device
    code = _doc_codes(capture, opt)
    sample_bucket = capture["bucket"].values
    n_head, n_bucket = qr.shape[0], len(fit.buckets)
    pos_mass = torch.full((n_head, n_bucket), float("nan"), dtype=torch.float64, device=dev)
    act_mass = pos_mass.clone()
    share = np.full(n_bucket, np.nan)
    for b in range(n_bucket):  # buckets only
        keys, qs = eligible[b], members[b]
        if keys.size == 0 or qs.size == 0 or not fit.usable[b]:
            continue
        nearest = torch.as_tensor(sample_bucket[keys] == sample_bucket[keys].max(), device=dev)  # [key]
        same = torch.as_tensor(code[qs][:, None] == code[keys][None, :], device=dev)  # [query, key]
        has = (same & nearest[None]).any(1)  # queries whose document has keys in the nearest bucket
        if not bool(has.any()):
            continue
        k_t = kr[:, keys]  # [head, key, dim]
        q1 = model.mean[:, b, 0]  # [head]
        s_pos = (q1[:, None] * k_t[..., 0] / math.sqrt(dim))[:, None, :].expand(-1, len(qs), -1)  # [head, query, key]
        s_act = torch.einsum("hnd,hkd->hnk", qr[:, qs], k_t) / math.sqrt(dim)
        for s, dst in ((s_pos, pos_mass), (s_act, act_mass)):
            w = torch.softmax(torch.where(same[None], s, torch.tensor(-torch.inf, dtype=s.dtype, device=dev)), -1)
            mass = (w * nearest[None, None]).sum(-1)  # [head, query]
            dst[:, b] = masked_mean(mass, has[None].expand_as(mass), -1)
        sh = (same & nearest[None]).sum(1) / same.sum(1).clamp_min(1)
        share[b] = float(sh[has].double().mean())
    return pos_mass, act_mass, share


def listwise(capture: xr.Dataset, options: AnalysisOptions | None = None, **overrides) -> xr.Dataset:
    """Listwise plasticity ``ap_set``/``ap_set_mc`` (head, query_bucket, set_size) and the nearest-bucket softmax mass.

    Returns
    -------
    xarray.Dataset
        ``ap_set`` (fitted Gaussian model), ``ap_set_mc`` (captured queries),
        ``n_sets`` (query_bucket, set_size); ``nearest_mass_position``,
        ``nearest_mass`` (head, query_bucket) and ``nearest_share`` (query_bucket),
        see :func:`nearest_bucket_mass`. Set sizes come from
        ``options.set_sizes`` (0: the whole eligible set of a document).
    """
    opt = AnalysisOptions.from_kwargs(options, **overrides)
    capture = analysis_vectors(capture, opt)
    dev = resolve_device(opt.device)
    fit = fitted_layout(capture, opt, dev)
    rng = np.random.default_rng(opt.seed)
    sizes = list(opt.set_sizes)
    sets = [draw_sets(capture, fit, opt, m, opt.n_sets, rng) for m in sizes]
    n_bucket, dim = len(fit.buckets), capture.sizes["dim"]
    for m, (_, mask) in zip(sizes, sets):
        if not mask.any():
            warnings.warn(f"set size {m}: no query bucket has a document with {m} eligible keys "
                          f"(pair_docs={opt.pair_docs!r}); ap_set is NaN there", PlasticityWarning, stacklevel=2)
    members = _bucket_queries(capture, n_bucket)
    eligible = [eligible_samples(capture, fit, opt, b) for b in range(n_bucket)]
    gen = torch.Generator().manual_seed(opt.seed)
    z = torch.randn(opt.n_model_queries, dim, generator=gen, dtype=torch.float64).to(dev)  # [draw, dim]
    n_q = max(int(fit.counts.max()), opt.n_model_queries)
    per_head = 8 * max(n_q * max(s[0].shape[1] * s[0].shape[2] for s in sets), n_q * capture.sizes["sample"]) * 4
    # the set-score temporaries are short-lived and few per call: a 256 MB budget (16x auto_chunk's) keeps the
    # Python loop over buckets and sizes from running once per head (measured 26 s -> see README for the figure)
    ap, ap_mc, near_pos, near_act = [], [], [], []
    for sl in head_chunks(capture.sizes["head"], opt.head_chunk or auto_chunk(per_head / 16, dev)):
        q, k = as_f64(capture["q"].values[sl], dev), as_f64(capture["k"].values[sl], dev)  # [head, sample, dim]
        qr, kr, model = rotate_and_fit(q, k, fit, opt)
        h = qr.shape[0]
        g = torch.full((h, n_bucket, len(sizes)), float("nan"), dtype=torch.float64, device=dev)
        e = g.clone()
        usable = torch.as_tensor(fit.usable, device=dev)
        for c, (m, (idx_np, mask_np)) in enumerate(zip(sizes, sets)):
            if m == 2:  # the Gaussian closed form exists: eq. 4.14 on the same pairs
                idx, set_ok = torch.as_tensor(idx_np, device=dev), torch.as_tensor(mask_np.all(-1), device=dev)
                delta = kr[:, idx[..., 0]] - kr[:, idx[..., 1]]  # [head, bucket, pair, dim]
                g[:, :, c] = masked_mean(closed_form_kernel(delta, model), set_ok[None] & usable[None, :, None], -1)
        for b in range(n_bucket):  # buckets only; heads, queries and sets are vectorised
            if not fit.usable[b]:
                continue
            s_cap = torch.einsum("hnd,hsd->hns", qr[:, torch.as_tensor(members[b], device=dev)], kr)  # [head, query, sample]
            s_mod = torch.einsum("hnd,hsd->hns", model_draws(model, z, b), kr)  # [head, draw, sample]
            for c, (m, (idx_np, mask_np)) in enumerate(zip(sizes, sets)):
                smask = torch.as_tensor(mask_np[b], device=dev)
                set_ok = smask.sum(-1) >= 2  # [set]
                if not bool(set_ok.any()):
                    continue
                idx = torch.as_tensor(idx_np[b], device=dev)
                pp = winner_plasticity(gather_sets(s_cap, idx, smask), smask, opt.mc_unbiased)
                e[:, b, c] = masked_mean(pp, set_ok[None].expand_as(pp), -1)
                if m != 2:
                    pp = winner_plasticity(gather_sets(s_mod, idx, smask), smask, True)
                    g[:, b, c] = masked_mean(pp, set_ok[None].expand_as(pp), -1)
        ap.append(g), ap_mc.append(e)
        pm, am, share = nearest_bucket_mass(qr, kr, model, fit, capture, opt, members, eligible)
        near_pos.append(pm), near_act.append(am)
    n_sets = np.stack([(mask.sum(-1) >= 2).sum(-1) for _, mask in sets], -1) * fit.usable[:, None]  # [bucket, size]
    dims = ("head", "query_bucket", "set_size")
    ds = xr.Dataset(
        {
            "ap_set": (dims, to_numpy(torch.cat(ap))),
            "ap_set_mc": (dims, to_numpy(torch.cat(ap_mc))),
            "nearest_mass_position": (("head", "query_bucket"), to_numpy(torch.cat(near_pos))),
            "nearest_mass": (("head", "query_bucket"), to_numpy(torch.cat(near_act))),
        },
        coords={"query_bucket": fit.buckets, "set_size": np.asarray(sizes, dtype=np.int64),
                "n_sets": (("query_bucket", "set_size"), n_sets.astype(np.int64)),
                "nearest_share": ("query_bucket", share)},
    )
    ds["ap_set"].attrs["meaning"] = ("listwise plasticity (1 - sum_i P_i^2) / (1 - 1/m) of the winner distribution under the "
                                     "fitted Gaussian model: closed form (eq. 4.14) at m = 2, model draws otherwise; set_size 0 = whole eligible set")
    ds["ap_set_mc"].attrs["meaning"] = "listwise plasticity from the bucket's captured queries (unbiased n/(n-1)), same sets"
    ds["nearest_mass_position"].attrs["meaning"] = "softmax mass on the nearest eligible bucket from the positional term alone"
    ds["nearest_mass"].attrs["meaning"] = "softmax mass on the nearest eligible bucket from the captured queries' full scores"
    ds.attrs["n_model_queries"] = opt.n_model_queries
    return ds


# --------------------------------------------------------------------------- across heads


def _spearman_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row pair of ``x``, ``y`` ``[rep, n]`` (ranks by double argsort)."""
    rx = np.argsort(np.argsort(x, axis=1), axis=1).astype(float)
    ry = np.argsort(np.argsort(y, axis=1), axis=1).astype(float)
    rx -= rx.mean(1, keepdims=True)
    ry -= ry.mean(1, keepdims=True)
    return (rx * ry).sum(1) / np.sqrt((rx * rx).sum(1) * (ry * ry).sum(1))


def head_level(metrics: xr.Dataset, variable: str = "ap_set") -> xr.DataArray:
    """Per-head mean over query buckets of a ``(head, query_bucket, set_size)`` variable (NaN buckets left out)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return metrics[variable].mean("query_bucket", skipna=True)


def pairwise_predicts_listwise(metrics: xr.Dataset, set_size: int, variable: str = "ap_set", n_boot: int = 2000,
                               n_perm: int = 2000, level: float = 0.95, seed: int = 0) -> dict:
    """Rank correlation across heads of pairwise AP (m = 2) with listwise AP at ``set_size``.

    Both are per-head means over the query buckets where the listwise value is
    defined (so the two average the same buckets). Returns ``rho``, the
    percentile interval of a bootstrap over heads (``lo``, ``hi``), the
    two-sided permutation p-value of rho = 0 (head labels of one side shuffled)
    and ``n_heads``. Vectorised over replicates.
    """
    sub = metrics[variable]
    both = sub.sel(set_size=set_size).notnull() & sub.sel(set_size=2).notnull()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        x = sub.sel(set_size=2).where(both).mean("query_bucket", skipna=True).values
        y = sub.sel(set_size=set_size).where(both).mean("query_bucket", skipna=True).values
    ok = ~np.isnan(x) & ~np.isnan(y)
    x, y = x[ok], y[ok]
    if len(x) < 3:
        raise ValueError(f"set size {set_size}: fewer than 3 heads with both pairwise and listwise values")
    rng = np.random.default_rng(seed)
    rho = float(_spearman_rows(x[None], y[None])[0])
    idx = rng.integers(0, len(x), (n_boot, len(x)))
    reps = _spearman_rows(x[idx], y[idx])
    perm = np.argsort(rng.random((n_perm, len(x))), axis=1)
    null = _spearman_rows(np.broadcast_to(x, perm.shape), y[perm])
    a = (1 - level) / 2
    lo, hi = np.nanquantile(reps, [a, 1 - a])
    return {"set_size": set_size, "rho": rho, "lo": float(lo), "hi": float(hi),
            "p_perm": float((1 + np.sum(np.abs(null) >= abs(rho))) / (1 + n_perm)), "n_heads": int(len(x))}


def mean_over_heads(values: np.ndarray, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """Mean over heads (axis 0, NaN left out) with a percentile bootstrap interval over heads."""
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return np.nan, np.nan, np.nan
    reps = v[np.random.default_rng(seed).integers(0, v.size, (n_boot, v.size))].mean(1)
    a = (1 - level) / 2
    return float(v.mean()), float(np.quantile(reps, a)), float(np.quantile(reps, 1 - a))


def listwise_summary(metrics: xr.Dataset, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per set size: mean over heads of the per-head mean ``ap_set`` and ``ap_set_mc``, with head-bootstrap intervals."""
    rows = []
    for m in metrics.set_size.values:
        row = {"set size": "whole set" if m == 0 else int(m),
               "buckets with sets": int((metrics.n_sets.sel(set_size=m) > 0).sum())}
        for name, label in (("ap_set", "model"), ("ap_set_mc", "captured")):
            est, lo, hi = mean_over_heads(head_level(metrics, name).sel(set_size=m).values, n_boot, seed=seed)
            row[f"{label}"], row[f"{label} 95% CI"] = round(est, 3), f"[{lo:.3f}, {hi:.3f}]"
        rows.append(row)
    return pd.DataFrame(rows).set_index("set size")

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
"""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from qkplast.tensors import as_f64, resolve_device
from qkplast.options import AnalysisOptions
from qkplast.analysis.vectors import analysis_vectors
from qkplast.analysis.pairs import pair_plan
from qkplast.analysis.plasticity import query_model, rotate
from qkplast.stats.decision import null_verdict
from qkplast.stats.shuffles import drift_axis_parts, position_shuffle_null

SUMMARIES = ("median", "q05", "q95", "spread")


def _summary(x: torch.Tensor, spread: str) -> torch.Tensor:
    """``[..., n] -> [..., 4]``: median, 5% and 95% quantiles and the spread statistic."""
    q = torch.quantile(x, torch.tensor([0.5, 0.05, 0.95], dtype=x.dtype, device=x.device), dim=-1)  # [3, ...]
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
        self.delta_all = kr[:, lay.pi] - kr[:, lay.pj]  # [head, bucket, pair, dim]
        self.valid_all = lay.pvalid
        mean_b = torch.einsum("bs,hsd->hbd", lay.onehot, qr) / lay.onehot.sum(1).clamp_min(1)[:, None]
        self.x = (qr[:, lay.qidx] - mean_b[:, :, None]) * lay.qmask[None, :, :, None]  # [head, bucket, n_max, dim]
        self.qmask, self.n = lay.qmask, lay.qmask.sum(1).to(qr.dtype)  # [bucket]
        self.qr, self.lay, self.dev = qr, lay, dev


def _bucket_permutations(mask: torch.Tensor, n_perm: int, extra: tuple, gen: torch.Generator) -> torch.Tensor:
    """Random permutations of each bucket's valid slots ``[perm, bucket, n_max, *extra]`` (padding stays put)."""
    keys = torch.rand((n_perm, *mask.shape, *extra), generator=gen, dtype=torch.float64, device=mask.device)
    pad = ~mask.reshape(1, *mask.shape, *([1] * len(extra)))
    keys = keys.masked_fill(pad, 2.0)  # padding sorts last, so valid slots permute among themselves
    return keys.argsort(dim=2)


def _ratio_diag_full(delta, var_diag, x, n, sigma2):
    """``v_diag / v_full`` ``[head, bucket, pair]`` from rotated deltas and centred queries (global fit)."""
    v_diag = (delta * delta * var_diag[:, :, None]).sum(-1)
    proj = torch.einsum("...hbmd,hbpd->...hbmp", x[..., 1:], delta[..., 1:])  # semantic score deviations
    v_full = (proj * proj).sum(-2) / (n - 1)[:, None] + delta[..., 0] ** 2 * sigma2[:, None, None]
    return v_diag / v_full


def diagonal_null(capture: xr.Dataset, n_perm: int = 1000, pairs_per_bucket: int = 4, seed: int = 0,
                  options: AnalysisOptions | None = None, perm_chunk: int = 8) -> xr.Dataset:
    """``v_diag / v_full`` against a within-bucket permutation of each semantic coordinate (see module doc).

    The spread statistic is ``log(q95 / q05)`` of the ratio over all (head,
    bucket, pair) terms; the null keeps every coordinate's variance, hence
    ``v_diag``, and recomputes ``v_full`` from the permuted queries.
    """
    s = _Setup(capture, options, pairs_per_bucket, seed)
    gen = torch.Generator(device=s.dev).manual_seed(seed)
    var, sig = s.model.cov, s.model.sigma2_pos
    ok = s.sub_ok[None].expand(s.delta.shape[:3]) & s.ok_bucket[None, :, None]
    spread = "log_q95_over_q05"
    observed = _summary(_ratio_diag_full(s.delta, var, s.x, s.n, sig)[ok], spread)
    ok_all = s.valid_all[None].expand(s.delta_all.shape[:3])
    # all pairs (the same numbers as pair_statistics' v_diag / v_full)
    observed_all = _summary(_ratio_diag_full(s.delta_all, var, s.x, s.n, sig)[ok_all], spread)
    null = []
    h, b, m, dim = s.x.shape
    v_diag = (s.delta * s.delta * var[:, :, None]).sum(-1)  # unchanged by the permutation
    d_sem = s.delta[..., 1:].transpose(-1, -2)  # [head, bucket, dim-1, pair]
    v1 = s.delta[..., 0] ** 2 * sig[:, None, None]
    for p0 in range(0, n_perm, perm_chunk):
        pc = min(perm_chunk, n_perm - p0)
        perm = _bucket_permutations(s.qmask, pc, (dim,), gen)  # [perm, bucket, n_max, dim]
        idx = perm.permute(1, 0, 2, 3).reshape(1, b, pc * m, dim).expand(h, -1, -1, -1)
        xp = torch.gather(s.x, 2, idx)  # [head, bucket, perm*n_max, dim]: layout ready for one batched matmul
        proj = (xp[..., 1:] @ d_sem).reshape(h, b, pc, m, -1)  # [head, bucket, perm, n_max, pair]
        v_full = (proj * proj).sum(3) / (s.n - 1)[None, :, None, None] + v1[:, :, None]
        null.append(_summary((v_diag[:, :, None] / v_full).permute(2, 0, 1, 3)[:, ok], spread))
    return _result(observed, observed_all, torch.cat(null), "v_diag / v_full", spread, n_perm, pairs_per_bucket,
                   seed, "each rotated semantic coordinate permuted independently across the bucket's queries "
                         "(one permutation per bucket and coordinate, shared by all heads)")


def bucket_shuffle_null(capture: xr.Dataset, n_perm: int = 1000, pairs_per_bucket: int = 32, seed: int = 0,
                        options: AnalysisOptions | None = None, perm_chunk: int = 25) -> xr.Dataset:
    """Per head, the median over the last bucket's pairs of ``max_b v / min_b v``; bucket labels shuffled
    within documents.

    ``v`` is the options' diagonal variance (eq. 4.12) of the last bucket's
    key pairs evaluated with each bucket's statistics (as
    :func:`qkplast.theory.checks.variance_across_buckets`). The reported summary is
    over heads; the spread statistic is the median over heads.
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
    sem2 = sem * sem  # [head, sample, dim-1]: the squares once, not once per permutation

    def bucket_var(labels):  # labels [perm, sample] -> [perm, head, bucket, dim-1]
        pc, (h, n, d) = labels.shape[0], sem.shape
        # the sums of each permutation's buckets by one scatter over stride-0 views: neither the samples nor the
        # labels are copied per permutation or per head (each bucket's sum adds its samples in sample order,
        # as index_add over a per-permutation copy did, so the values are the same bit for bit)
        idx = labels[None, :, :, None].expand(h, pc, n, d)  # [head, perm, sample, dim-1]
        s1 = torch.zeros(h, pc, n_bucket, d, dtype=sem.dtype, device=s.dev)  # [head, perm, bucket, dim-1]
        s2 = torch.zeros_like(s1)
        s1.scatter_add_(2, idx, sem[:, None].expand(h, pc, n, d))
        s2.scatter_add_(2, idx, sem2[:, None].expand(h, pc, n, d))
        cnt = torch.as_tensor(lay.counts, device=s.dev, dtype=sem.dtype).clamp_min(2)
        var = (s2 - s1 * s1 / cnt[:, None]) / (cnt[:, None] - 1)
        return var.transpose(0, 1)

    observed = per_head(s.model.cov[..., 1:])
    ok_all = s.valid_all[-1]
    d_all = s.delta_all[:, -1][:, ok_all]
    v_all = torch.einsum("hpd,hbd->hbp", d_all * d_all, s.model.cov)[:, s.ok_bucket]
    observed_all = (v_all.amax(1) / v_all.amin(1)).median(-1).values
    spread = "median_over_heads"
    null = []
    order = torch.argsort(doc, stable=True)  # samples grouped by document
    for p0 in range(0, n_perm, perm_chunk):
        pc = min(perm_chunk, n_perm - p0)
        keys = doc[None] + torch.rand((pc, doc.numel()), generator=gen, dtype=torch.float64, device=s.dev)
        shuffled = torch.argsort(keys, dim=1)  # each document's samples in a random order, documents in order
        labels = torch.empty((pc, doc.numel()), dtype=torch.long, device=s.dev)
        labels[:, order] = bucket[shuffled]  # the i-th sample of a document takes the label of a random one
        null.append(_summary(per_head(bucket_var(labels)), spread))
    return _result(_summary(observed, spread), _summary(observed_all, spread), torch.cat(null),
                   "per head: median over the last bucket's pairs of max_b v / min_b v", spread, n_perm,
                   pairs_per_bucket, seed, "bucket labels permuted among the samples of each document")


def independence_null(capture: xr.Dataset, n_perm: int = 1000, pairs_per_bucket: int = 32, seed: int = 0,
                      options: AnalysisOptions | None = None, perm_chunk: int = 50) -> xr.Dataset:
    """``v_joint / v_indep`` against a within-bucket permutation of rotated coordinate 1 (see module doc).

    With the bucket's own moments of all d coordinates, ``v_joint = v_indep +
    2 delta_1 sum_e Cov(x_1, x_e) delta_e``; permuting coordinate 1 changes only
    that cross term. Spread statistic: ``log(q95 / q05)`` over all terms.
    """
    s = _Setup(capture, options, pairs_per_bucket, seed, positional_fit="per_bucket")
    gen = torch.Generator(device=s.dev).manual_seed(seed)
    n1 = (s.n - 1)[None, :, None]
    ok = s.sub_ok[None].expand(s.delta.shape[:3]) & s.ok_bucket[None, :, None]

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
    proj_all, v_indep_all = parts(s.delta_all, s.x)
    cross_all = torch.einsum("hbm,hbmp->hbp", x1, proj_all) / n1
    ok_all = s.valid_all[None].expand(s.delta_all.shape[:3])
    observed_all = _summary(((v_indep_all + 2 * s.delta_all[..., 0] * cross_all) / v_indep_all)[ok_all], spread)
    null = []
    h = x1.shape[0]
    for p0 in range(0, n_perm, perm_chunk):
        pc = min(perm_chunk, n_perm - p0)
        perm = _bucket_permutations(s.qmask, pc, (), gen)  # [perm, bucket, n_max]
        x1p = torch.gather(x1[None].expand(pc, -1, -1, -1), 3, perm[:, None].expand(-1, h, -1, -1))
        null.append(_summary(ratio(x1p)[:, ok], spread))
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

    def off_axis(b_q, b_k, mu_q, stt):
        bias, slope = drift_axis_parts(b_q, b_k, mu_q)
        return ((slope - bias) / stt).mean(0)  # [perm]

    return position_shuffle_null(capture, off_axis, n_perm, seed, chunk)


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

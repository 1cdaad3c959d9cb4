"""The planar rotation model: drift axis a, separation axis b, bias strength (section 4.3).

* axis a (eq. 4.3): ``Cov(x, t) / ||Cov(x, t)||`` over the pooled Q+K cloud; it
  maximises the linear covariance of a projection with position, and every
  direction orthogonal to it has zero linear position covariance;
* axis b (eq. 4.5): the Q/K centroid difference with its a-component removed;
* ``alpha_k``, ``alpha_q``: least-squares slopes of key / query projections on a
  against position; ``mu_q_a``: mean query projection on a;
* ``bias_strength = mu_q_a * alpha_k`` (eq. 4.6): the rate at which the mean
  a-axis contribution to ``q^T k`` grows with the key's position;
* ``key_position_slope = mu_Q^T beta_K`` with ``beta_K`` the least-squares
  slope of the keys over position (fitted as ``alpha_k`` is, on all d
  coordinates): the full slope of the mean query's score over key position.
  It equals ``bias_strength + mu_Q^T P beta_K`` (``P`` the projector off a);
  zero position covariance of the pooled cloud off a does not make the keys'
  own drift off a vanish, so the second term is not zero in general.
  ``key_position_ratio = key_position_slope / bias_strength``;
* ``separation_strength = (mu_Q - mu_K)^T b``: the maximised objective of eq. 4.4;
* ``plane_variance_fraction``: share of the pooled cloud's total variance in the
  {a, b} plane.
"""

from __future__ import annotations

import torch
import xarray as xr

from ._torch import as_f64, auto_chunk, head_chunks, resolve_device, to_numpy

SCALARS = (
    "alpha_q", "alpha_k", "mu_q_a", "bias_strength", "r_q_a", "r_k_a", "separation_strength",
    "plane_variance_fraction", "position_cov_a", "orthogonal_position_cov", "key_position_slope",
    "key_position_ratio",
)


def _unit(v: torch.Tensor) -> torch.Tensor:
    n = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    return torch.where(n > 0, v / torch.where(n > 0, n, torch.ones_like(n)), torch.full_like(v, float("nan")))


def rotation_kernel(q: torch.Tensor, k: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rotation metrics per head from ``q, k`` ``[head, sample, dim]`` and positions ``t`` ``[sample]``.

    Every metric is a moment of the two clouds: their centred position
    covariances ``Cov(q, t)``, ``Cov(k, t)`` and their projections on the axes,
    so the pooled cloud ``[head, 2 sample, dim]`` is never formed.
    ``orthogonal_position_cov`` is the norm of the position covariance of the
    cloud projected onto the complement of ``a`` (the largest linear position
    covariance any unit direction orthogonal to ``a`` has), computed from the
    data as ``sum x (t - t_bar) - a sum (a^T x)(t - t_bar)``: the clouds' cross
    sums minus those of their projections on ``a``. It is zero by construction
    (eq. 4.3) and comes out at rounding level.
    """
    n = q.shape[1]
    tc = t - t.mean()  # [sample]
    stt = (tc * tc).sum()
    qc, kc = q - q.mean(1, keepdim=True), k - k.mean(1, keepdim=True)  # [head, sample, dim]
    sq, sk = torch.einsum("hsd,s->hd", qc, tc), torch.einsum("hsd,s->hd", kc, tc)  # [head, dim] sum (x - mean) t_c
    # the pooled cloud has the same positions twice, so its centred cross sum is sq + sk (2n - 1 dof)
    c = (sq + sk) / (2 * n - 1)  # [head, dim] Cov(x, t) of the pooled cloud
    a = _unit(c)  # eq. 4.3
    mu_q, mu_k = q.mean(1), k.mean(1)
    diff = mu_q - mu_k  # [head, dim]
    b = _unit(diff - (diff * a).sum(-1, keepdim=True) * a)  # eq. 4.5
    qa, ka = torch.einsum("hsd,hd->hs", qc, a), torch.einsum("hsd,hd->hs", kc, a)  # [head, sample] centred
    qb, kb = torch.einsum("hsd,hd->hs", qc, b), torch.einsum("hsd,hd->hs", kc, b)
    alpha_q, alpha_k = (qa @ tc) / stt, (ka @ tc) / stt  # [head]
    mu_q_a = (mu_q * a).sum(-1)
    total_var = ((qc * qc).sum((1, 2)) + (kc * kc).sum((1, 2)) + 0.5 * n * (diff * diff).sum(-1)) / (2 * n - 1)

    def pooled_var(pq, pk, dm):
        """Variance of the pooled projections from the centred ones and the mean difference ``dm``."""
        return ((pq * pq).sum(-1) + (pk * pk).sum(-1) + 0.5 * n * dm * dm) / (2 * n - 1)

    var_a = pooled_var(qa, ka, (diff * a).sum(-1))
    var_b = pooled_var(qb, kb, (diff * b).sum(-1))
    # Cov(x - (a.x) a, t) from the data: the cross sums of the clouds minus a times those of their projections
    c_perp = (sq + sk - a * (qa @ tc + ka @ tc)[:, None]) / (2 * n - 1)  # [head, dim]
    key_slope = (mu_q * sk).sum(-1) / stt  # mu_Q^T beta_K
    bias = mu_q_a * alpha_k

    def corr(p):
        den = torch.sqrt((p * p).sum(-1) * stt)
        return torch.where(den > 0, (p @ tc) / den, torch.full_like(den, float("nan")))

    return {
        "axis_a": a,
        "axis_b": b,
        "alpha_q": alpha_q,
        "alpha_k": alpha_k,
        "mu_q_a": mu_q_a,
        "bias_strength": bias,  # eq. 4.6
        "r_q_a": corr(qa),
        "r_k_a": corr(ka),
        "separation_strength": (diff * b).sum(-1),
        "plane_variance_fraction": (var_a + var_b) / total_var,
        "position_cov_a": (c * a).sum(-1),
        "orthogonal_position_cov": torch.linalg.vector_norm(c_perp, dim=-1),
        "key_position_slope": key_slope,
        "key_position_ratio": torch.where(bias != 0, key_slope / torch.where(bias != 0, bias, torch.ones_like(bias)),
                                          torch.full_like(bias, float("nan"))),
    }


def _bytes_per_head(capture: xr.Dataset) -> int:
    return 8 * 4 * capture.sizes["sample"] * capture.sizes["dim"]  # both clouds and their centred copies


def rotation(capture: xr.Dataset, *, device="auto", head_chunk: int = 0) -> xr.Dataset:
    """Rotation metrics per head (dims ``head``; axes with dims ``head, dim``)."""
    dev = resolve_device(device)
    t = as_f64(capture["position"], dev)
    parts = [
        rotation_kernel(as_f64(capture["q"].values[sl], dev), as_f64(capture["k"].values[sl], dev), t)
        for sl in head_chunks(capture.sizes["head"], head_chunk or auto_chunk(_bytes_per_head(capture), dev))
    ]
    out = {}
    for name in parts[0]:
        value = to_numpy(torch.cat([p[name] for p in parts]))
        out[name] = (("head", "dim") if value.ndim == 2 else ("head",), value)
    ds = xr.Dataset(out)
    ds["orthogonal_position_cov"].attrs["meaning"] = (
        "max over unit u orthogonal to axis a of |Cov(u^T x, t)|, measured on the pooled Q+K data; "
        "zero up to rounding by construction (eq. 4.3)"
    )
    ds["key_position_slope"].attrs["meaning"] = (
        "mu_Q^T beta_K: slope over key position of the mean query's score (beta_K the least-squares slope of "
        "the keys on position); equals bias_strength + mu_Q^T P beta_K, P the projector off axis a")
    ds["key_position_ratio"].attrs["meaning"] = "key_position_slope / bias_strength (NaN where bias_strength = 0)"
    return ds

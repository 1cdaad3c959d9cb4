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

from qkplast.tensors import as_f64, auto_chunk, head_vectors, map_head_chunks, resolve_device, to_numpy
from qkplast.analysis.moments import CloudMoments, cloud_moments

def _unit(v: torch.Tensor) -> torch.Tensor:
    n = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    return torch.where(n > 0, v / torch.where(n > 0, n, torch.ones_like(n)), torch.full_like(v, float("nan")))


def rotation_from_moments(m: CloudMoments) -> dict[str, torch.Tensor]:
    """Rotation metrics per head from the clouds' moments (:func:`qkplast.analysis.moments.cloud_moments`).

    Every metric is a moment of the two clouds: their position cross sums
    ``sum (x - mean)(t - t_bar)`` and scatter matrices projected on the axes,
    so the pooled cloud ``[head, 2 sample, dim]`` is never formed.
    ``orthogonal_position_cov`` is the norm of the position covariance of the
    cloud projected onto the complement of ``a`` (the largest linear position
    covariance any unit direction orthogonal to ``a`` has):
    ``sum x (t - t_bar) - a sum (a^T x)(t - t_bar)``, the clouds' cross sums
    minus those of their projections on ``a``. It is zero by construction
    (eq. 4.3) and comes out at rounding level.
    """
    n, stt = m.n, m.stt
    sq, sk = m.cross_q, m.cross_k  # [head, dim]
    # the pooled cloud has the same positions twice, so its centred cross sum is sq + sk (2n - 1 dof)
    c = (sq + sk) / (2 * n - 1)  # [head, dim] Cov(x, t) of the pooled cloud
    a = _unit(c)  # eq. 4.3
    diff = m.mean_difference  # [head, dim]
    b = _unit(diff - (diff * a).sum(-1, keepdim=True) * a)  # eq. 4.5
    qa_t, ka_t = (sq * a).sum(-1), (sk * a).sum(-1)  # [head] sum (a^T x - mean)(t - t_bar)
    qa2, ka2 = m.sum_of_squares(a)  # [head] sum (a^T (x - mean))^2
    alpha_q, alpha_k = qa_t / stt, ka_t / stt
    mu_q_a = (m.mean_q * a).sum(-1)
    total_var = (m.total_sum_of_squares() + 0.5 * n * (diff * diff).sum(-1)) / (2 * n - 1)

    def pooled_var(pq2, pk2, dm):
        """Variance of the pooled projections from the centred sums of squares and the mean difference ``dm``."""
        return (pq2 + pk2 + 0.5 * n * dm * dm) / (2 * n - 1)

    var_a = pooled_var(qa2, ka2, (diff * a).sum(-1))
    var_b = pooled_var(*m.sum_of_squares(b), (diff * b).sum(-1))
    c_perp = (sq + sk - a * (qa_t + ka_t)[:, None]) / (2 * n - 1)  # [head, dim]
    key_slope = (m.mean_q * sk).sum(-1) / stt  # mu_Q^T beta_K
    bias = mu_q_a * alpha_k

    def corr(p_t, p2):
        den = torch.sqrt(p2 * stt)
        return torch.where(den > 0, p_t / torch.where(den > 0, den, torch.ones_like(den)), torch.full_like(den, float("nan")))

    return {
        "axis_a": a,
        "axis_b": b,
        "alpha_q": alpha_q,
        "alpha_k": alpha_k,
        "mu_q_a": mu_q_a,
        "bias_strength": bias,  # eq. 4.6
        "r_q_a": corr(qa_t, qa2),
        "r_k_a": corr(ka_t, ka2),
        "separation_strength": (diff * b).sum(-1),
        "plane_variance_fraction": (var_a + var_b) / total_var,
        "position_cov_a": (c * a).sum(-1),
        "orthogonal_position_cov": torch.linalg.vector_norm(c_perp, dim=-1),
        "key_position_slope": key_slope,
        "key_position_ratio": torch.where(bias != 0, key_slope / torch.where(bias != 0, bias, torch.ones_like(bias)),
                                          torch.full_like(bias, float("nan"))),
    }


def rotation_kernel(q: torch.Tensor, k: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rotation metrics per head from ``q, k`` ``[head, sample, dim]`` and positions ``t`` ``[sample]``."""
    return rotation_from_moments(cloud_moments(q, k, t, scatter=False))


def _bytes_per_head(capture: xr.Dataset) -> int:
    return 8 * 4 * capture.sizes["sample"] * capture.sizes["dim"]  # both clouds and their centred copies


def rotation(capture: xr.Dataset, *, device="auto", head_chunk: int = 0) -> xr.Dataset:
    """Rotation metrics per head (dims ``head``; axes with dims ``head, dim``)."""
    dev = resolve_device(device)
    t = as_f64(capture["position"], dev)
    chunk = head_chunk or auto_chunk(_bytes_per_head(capture), dev)
    return rotation_dataset(map_head_chunks(lambda sl: rotation_kernel(*head_vectors(capture, sl, dev), t),
                                            capture.sizes["head"], chunk, dev))


def rotation_dataset(parts: list[dict[str, torch.Tensor]]) -> xr.Dataset:
    """The Dataset of :func:`rotation` from the results of consecutive chunks of heads."""
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

"""PCA of the pooled query+key cloud of each head (thesis section 4.2).

For each head the query and key vectors are pooled into one cloud; its principal
components are found, and each component's projection is correlated with token
position separately for queries (``r_q``) and keys (``r_k``). The sign of each
component is fixed so that the larger of ``|r_q|``, ``|r_k|`` is positive. The
taxonomy uses ``(r_q^(0), r_k^(0))`` on the first component.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import xarray as xr

from qkplast.tensors import as_f64, auto_chunk, head_vectors, map_head_chunks, matmul, resolve_device, to_numpy
from qkplast.analysis.moments import CloudMoments, cloud_moments
from qkplast.analysis.schema import TAXONOMY  # noqa: F401  (its classes, importable here as before; defined without torch)


@dataclass
class PCAResult:
    explained_variance_ratio: torch.Tensor  # [head, pc]
    r_q: torch.Tensor  # [head, pc]
    r_k: torch.Tensor  # [head, pc]
    components: torch.Tensor  # [head, pc, dim], sign-canonicalised


def pooled_covariance(mean_q, scatter_q, mean_k, scatter_k, n: int) -> torch.Tensor:
    """Covariance ``[head, dim, dim]`` of the pooled cloud of ``n`` queries and ``n`` keys from their own moments.

    Sums of squares about the pooled mean ``(mu_Q + mu_K)/2``:
    ``S_Q + S_K + (n/2) d d^T`` with the clouds' scatter matrices ``S`` and
    ``d = mu_Q - mu_K``, over ``2n - 1``. One Gram matrix per cloud instead of
    a third one of the pooled cloud.
    """
    d = mean_q - mean_k  # [head, dim]
    return torch.baddbmm(scatter_q + scatter_k, d[:, :, None], d[:, None, :], alpha=0.5 * n).div_(2 * n - 1)


def pca_from_moments(m: CloudMoments) -> PCAResult:
    """PCA of the pooled Q+K cloud per head from the clouds' moments (:func:`qkplast.analysis.moments.cloud_moments`).

    Notes
    -----
    Correlations use moments rather than projected samples:
    ``Cov(x^T v, t) = Cov(x, t)^T v`` and ``Var(x^T v) = v^T Cov(x) v``, so
    ``r = v^T sum (x - mean)(t - t_bar) / sqrt(v^T S v * sum (t - t_bar)^2)``
    with ``S`` the cloud's scatter matrix.
    """
    n = m.n
    cov = pooled_covariance(m.mean_q, m.scatter_q, m.mean_k, m.scatter_k, n)
    evals, evecs = torch.linalg.eigh(cov)  # [head, pc], [head, dim, pc]
    evals, evecs = evals.flip(-1).clamp_min(0), evecs.flip(-1)  # descending
    evr = evals / evals.sum(-1, keepdim=True)  # [head, pc]

    # a component whose eigenvalue is zero to rounding (fewer samples than dimensions: the null space of the
    # cloud) carries no variance, so it has no correlation with position: NaN, not a ratio of rounding errors
    spanned = evals > evals[:, :1] * (evals.shape[-1] * torch.finfo(evals.dtype).eps)  # [head, pc]

    def corr(cross, scatter):
        num = matmul(cross[:, None, :], evecs)[:, 0]  # [head, pc]
        var = (matmul(scatter, evecs) * evecs).sum(1).clamp_min(0)  # [head, pc]: v^T S v per component
        den = torch.sqrt(var * m.stt)
        ok = (den > 0) & spanned
        return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.full_like(num, float("nan")))

    r_q, r_k = corr(m.cross_q, m.scatter_q), corr(m.cross_k, m.scatter_k)
    # the larger |r| decides the sign; a NaN side never wins (both NaN: the sign stays +1)
    dominant = torch.where(r_q.abs().nan_to_num(-1.0) >= r_k.abs().nan_to_num(-1.0), r_q, r_k)
    sign = torch.where(dominant < 0, -1.0, 1.0).to(evecs.dtype)  # [head, pc]
    return PCAResult(evr, r_q * sign, r_k * sign, (evecs * sign[:, None, :]).transpose(-1, -2))


def pca_kernel(q: torch.Tensor, k: torch.Tensor, t: torch.Tensor) -> PCAResult:
    """PCA of pooled Q+K per head with position correlations.

    Parameters
    ----------
    q, k : Tensor ``[head, sample, dim]``
    t : Tensor ``[sample]`` token positions (float64)
    """
    return pca_from_moments(cloud_moments(q, k, t))


def classify(r_q0: np.ndarray, r_k0: np.ndarray, low: float = 0.3, high: float = 0.7) -> np.ndarray:
    """Head taxonomy of section 4.2.2 from the correlations on PC0.

    ``position-dominated``: both ``|r| > high``; ``q-positional``: ``|r_q| > high``
    only; ``content-focused``: both ``|r| < low``; ``mixed``: the rest (the
    thesis has no key-positional class: ``|r_k| > high >= |r_q|`` is mixed).
    """
    aq, ak = np.abs(r_q0), np.abs(r_k0)
    out = np.full(aq.shape, "mixed", dtype=object)
    out[(aq < low) & (ak < low)] = "content-focused"
    out[(aq > high) & ~(ak > high)] = "q-positional"
    out[(aq > high) & (ak > high)] = "position-dominated"
    return out.astype(str)


def _bytes_per_head(capture: xr.Dataset) -> int:
    return 8 * 4 * capture.sizes["sample"] * capture.sizes["dim"]  # pooled cloud and its centred copy


def pca(capture: xr.Dataset, *, taxonomy_low: float = 0.3, taxonomy_high: float = 0.7, device="auto",
        head_chunk: int = 0, keep_components: bool = False) -> xr.Dataset:
    """PCA metrics per head: ``explained_variance_ratio``, ``r_q_pc``, ``r_k_pc`` (dims head, pc), ``taxonomy``."""
    dev = resolve_device(device)
    t = as_f64(capture["position"], dev)
    chunk = head_chunk or auto_chunk(_bytes_per_head(capture), dev)
    parts = map_head_chunks(lambda sl: pca_kernel(*head_vectors(capture, sl, dev), t), capture.sizes["head"], chunk, dev)
    return pca_dataset(parts, taxonomy_low, taxonomy_high, keep_components)


def pca_dataset(parts: list[PCAResult], taxonomy_low: float = 0.3, taxonomy_high: float = 0.7,
                keep_components: bool = False) -> xr.Dataset:
    """The Dataset of :func:`pca` from the results of consecutive chunks of heads."""
    cat = lambda name: to_numpy(torch.cat([getattr(p, name) for p in parts]))  # noqa: E731
    r_q, r_k = cat("r_q"), cat("r_k")
    out = xr.Dataset(
        {
            "explained_variance_ratio": (("head", "pc"), cat("explained_variance_ratio")),
            "r_q_pc": (("head", "pc"), r_q),
            "r_k_pc": (("head", "pc"), r_k),
            "taxonomy": ("head", classify(r_q[:, 0], r_k[:, 0], taxonomy_low, taxonomy_high)),
        },
        coords={"pc": np.arange(r_q.shape[1])},
    )
    if keep_components:
        out["components"] = (("head", "pc", "dim"), cat("components"))
    out["taxonomy"].attrs["thresholds"] = [taxonomy_low, taxonomy_high]
    return out

"""The moments of a head's query and key clouds that PCA, the rotation model and plasticity share.

Sections 4.2 and 4.3 are functions of a few moments of each cloud: its mean,
its centred scatter matrix ``sum (x - mean)(x - mean)^T`` and its cross sum
with position ``sum (x - mean)(t - t_bar)``; section 4.4 starts from the same
centred clouds. :func:`cloud_moments` computes them once per chunk of heads,
so :func:`qkplast.analyze` reads and centres every head's vectors once for all
three analyses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkplast.tensors import gram, matmul, scratch


@dataclass
class CloudMoments:
    """Moments of ``n`` queries and ``n`` keys per head, captured at the same positions ``t``.

    Attributes
    ----------
    n : int
        Samples per cloud.
    mean_q, mean_k : Tensor ``[head, dim]``
    centred_q, centred_k : Tensor ``[head, sample, dim]``
        The clouds minus their means (float64).
    cross_q, cross_k : Tensor ``[head, dim]``
        ``sum_s (x_s - mean)(t_s - t_bar)``.
    scatter_q, scatter_k : Tensor ``[head, dim, dim]`` or None
        ``sum_s (x_s - mean)(x_s - mean)^T``; None when not asked for.
    t_centred : Tensor ``[sample]``
        ``t - t_bar``.
    stt : Tensor (scalar)
        ``sum_s (t_s - t_bar)^2``.
    """

    n: int
    mean_q: torch.Tensor
    mean_k: torch.Tensor
    centred_q: torch.Tensor
    centred_k: torch.Tensor
    cross_q: torch.Tensor
    cross_k: torch.Tensor
    scatter_q: torch.Tensor | None
    scatter_k: torch.Tensor | None
    t_centred: torch.Tensor
    stt: torch.Tensor

    @property
    def mean_difference(self) -> torch.Tensor:
        """``mu_Q - mu_K`` ``[head, dim]``."""
        return self.mean_q - self.mean_k

    def sum_of_squares(self, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``sum_s (v^T (x_s - mean))^2`` of the queries and of the keys ``[head]``, for unit vectors ``v`` ``[head, dim]``.

        From the scatter matrices (``v^T S v``) when they were computed, else from the centred clouds.
        """
        if self.scatter_q is not None:
            return tuple(((s @ v[..., None])[..., 0] * v).sum(-1) for s in (self.scatter_q, self.scatter_k))
        return tuple(((x @ v[..., None])[..., 0] ** 2).sum(-1) for x in (self.centred_q, self.centred_k))

    def total_sum_of_squares(self) -> torch.Tensor:
        """``sum_s ||x_s - mean||^2`` over both clouds ``[head]`` (the traces of the two scatter matrices)."""
        if self.scatter_q is not None:
            return sum(s.diagonal(dim1=-2, dim2=-1).sum(-1) for s in (self.scatter_q, self.scatter_k))
        return sum((x * x).sum((1, 2)) for x in (self.centred_q, self.centred_k))

    @property
    def beta_q(self) -> torch.Tensor:
        """Least-squares slope of the queries over position ``[head, dim]`` (the query drift of eq. 4.10)."""
        return self.cross_q / self.stt


def cloud_moments(q: torch.Tensor, k: torch.Tensor, t: torch.Tensor, *, scatter: bool = True) -> CloudMoments:
    """Means, centred clouds, position cross sums and (with ``scatter``) scatter matrices of ``q`` and ``k``.

    Parameters
    ----------
    q, k : Tensor ``[head, sample, dim]``
        Queries and keys, any float dtype; the moments are float64.
    t : Tensor ``[sample]``
        Token positions (float64).
    scatter : bool
        Compute the ``[head, dim, dim]`` scatter matrices (PCA and the rotation
        model need them, plasticity does not). Two-pass: centred first, so no
        ``E[x x^T] - mean mean^T`` cancellation.

    Inside :func:`qkplast.tensors.map_head_chunks` the centred clouds are
    per-thread scratch buffers (:func:`qkplast.tensors.scratch`), valid until the
    same thread's next call.
    """
    n = q.shape[1]
    tc = t - t.mean()  # [sample]
    mean_q, mean_k = (x.sum(1, dtype=torch.float64) / n for x in (q, k))  # [head, dim]
    # converted and centred in one pass, into new tensors: never the caller's
    qc, kc = (torch.sub(x, mean[:, None], out=scratch(name, tuple(x.shape), x, torch.float64))
              for name, x, mean in (("centred_q", q, mean_q), ("centred_k", k, mean_k)))  # [head, sample, dim]
    scatter_of = gram if scatter else (lambda x: None)  # [head, dim, dim]
    return CloudMoments(
        n=n, mean_q=mean_q, mean_k=mean_k, centred_q=qc, centred_k=kc,
        cross_q=matmul(tc, qc), cross_k=matmul(tc, kc),  # [head, dim]
        scatter_q=scatter_of(qc), scatter_k=scatter_of(kc), t_centred=tc, stt=tc @ tc,
    )


def slope(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Least-squares slope of each column of ``x`` ``[..., sample, dim]`` regressed on positions ``t``: Cov(x, t) / Var(t).

    ``t`` is ``[..., sample]`` or ``[sample]``; the result is ``[..., dim]``. A zero-variance ``t`` gives NaN
    or Inf, never a silent zero.
    """
    t = t.expand(x.shape[:-1])
    xc = x - x.mean(-2, keepdim=True)  # [..., sample, dim]
    tc = t - t.mean(-1, keepdim=True)  # [..., sample]
    return torch.einsum("...sd,...s->...d", xc, tc) / (tc * tc).sum(-1, keepdim=True)

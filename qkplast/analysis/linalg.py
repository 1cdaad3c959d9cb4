"""Householder reflection that sends a direction to the first basis vector (eq. 4.10).

The thesis writes ``H = I - 2 u u^T / ||u||^2`` with ``u = beta_hat - e1``. When
``beta_hat`` is close to ``e1`` the first entry ``beta_hat_1 - 1`` cancels
catastrophically and ``H`` loses all precision. The stable form (Golub & Van
Loan, Algorithm 5.1.1) computes that entry as ``-sum_{j>1} x_j^2 / (x_1 + ||x||)``
when ``x_1 > 0``, which involves no subtraction of nearly equal numbers. At
``x = +||x|| e1`` the reflection is the identity (``u = 0``); at ``x = -||x|| e1``
it is ``I - 2 e1 e1^T``.
"""

from __future__ import annotations

import torch

from qkplast.tensors import matmul


def householder_vector(x: torch.Tensor) -> torch.Tensor:
    """Vector ``u`` with ``(I - 2 u u^T/||u||^2) x = ||x|| e1``, computed without cancellation.

    Parameters
    ----------
    x : Tensor ``[..., dim]``
        Directions to reflect (need not be unit length; must be non-zero).

    Returns
    -------
    Tensor ``[..., dim]``
        ``u``; all zeros where ``x`` already points along ``+e1`` (then H = I).
    """
    norm = torch.linalg.vector_norm(x, dim=-1)  # [...]
    if (norm == 0).any():
        raise ValueError("cannot reflect a zero vector onto e1: the drift direction beta is zero")
    x1 = x[..., 0]
    tail = (x[..., 1:] ** 2).sum(-1)  # [...]
    # x1 - ||x|| rewritten for x1 > 0 so that no nearly equal numbers are subtracted.
    first = torch.where(x1 > 0, -tail / (x1 + norm).clamp_min(torch.finfo(x.dtype).tiny), x1 - norm)
    return torch.cat([first[..., None], x[..., 1:]], dim=-1)


def householder_apply(u: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Apply ``H = I - 2 u u^T/||u||^2`` to the rows of ``y`` without forming H.

    ``u`` is ``[head, dim]``, ``y`` is ``[head, sample, dim]``; a zero ``u`` means H = I.
    ``out`` (may be ``y`` itself) receives the result.
    """
    uu = (u * u).sum(-1)  # [head]
    scale = torch.where(uu > 0, 2.0 / torch.where(uu > 0, uu, torch.ones_like(uu)), torch.zeros_like(uu))
    # one matrix-vector product for the projections, then a fused multiply-add with the broadcast u: y is read
    # twice and written once (a product and a sum, or a batched rank-1 update, take twice as long on the CPU)
    proj = matmul(y, (scale[:, None] * u)[..., None])  # [head, sample, 1]
    return torch.addcmul(y, proj, u[:, None, :], value=-1.0, out=out)  # [head, sample, dim]


def householder_matrix(u: torch.Tensor) -> torch.Tensor:
    """The explicit ``[..., dim, dim]`` reflection, for checks and small problems."""
    eye = torch.eye(u.shape[-1], dtype=u.dtype, device=u.device).expand(*u.shape[:-1], -1, -1)
    uu = (u * u).sum(-1)[..., None, None]
    outer = u[..., :, None] * u[..., None, :]
    return eye - torch.where(uu > 0, 2 * outer / torch.where(uu > 0, uu, torch.ones_like(uu)), torch.zeros_like(outer))

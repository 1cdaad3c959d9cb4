"""Vectorised moment kernels over a sample axis (float64 torch tensors).

All kernels reduce over the second-to-last axis of ``x`` (``[..., sample, dim]``)
against a position vector ``t`` of shape ``[..., sample]`` or ``[sample]``.
A zero-variance input gives NaN, never a silent zero.
"""

from __future__ import annotations

import torch


def _centered(x: torch.Tensor, t: torch.Tensor):
    t = t.expand(x.shape[:-1])
    xc = x - x.mean(-2, keepdim=True)  # [..., sample, dim]
    tc = t - t.mean(-1, keepdim=True)  # [..., sample]
    return xc, tc


def covariance_with(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Sample covariance of every column of ``x`` with ``t``: ``[..., dim]`` (ddof=1)."""
    xc, tc = _centered(x, t)
    return torch.einsum("...sd,...s->...d", xc, tc) / (x.shape[-2] - 1)


def slope(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Least-squares slope of each column of ``x`` regressed on ``t``: Cov(x, t) / Var(t)."""
    xc, tc = _centered(x, t)
    return torch.einsum("...sd,...s->...d", xc, tc) / (tc * tc).sum(-1, keepdim=True)


def pearson(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Pearson correlation of each column of ``x`` with ``t``: ``[..., dim]``."""
    xc, tc = _centered(x, t)
    num = torch.einsum("...sd,...s->...d", xc, tc)
    den = torch.sqrt((xc * xc).sum(-2) * (tc * tc).sum(-1, keepdim=True))
    return torch.where(den > 0, num / den, torch.full_like(num, float("nan")))


def covariance(x: torch.Tensor) -> torch.Tensor:
    """Sample covariance matrix over the sample axis: ``[..., dim, dim]`` (ddof=1)."""
    xc = x - x.mean(-2, keepdim=True)
    return xc.transpose(-1, -2) @ xc / (x.shape[-2] - 1)

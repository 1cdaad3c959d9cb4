"""Device resolution and float64 tensors: every statistic in qkplast is computed in float64."""

from __future__ import annotations

import numpy as np
import torch

DTYPE = torch.float64


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``"auto"`` (or None) picks CUDA when present, else the CPU; anything else is passed to torch."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was asked for but torch sees no CUDA device")
    return device


def as_f64(x, device: torch.device) -> torch.Tensor:
    """A float64 tensor on ``device`` (from numpy, xarray or torch)."""
    if hasattr(x, "values") and not isinstance(x, torch.Tensor):
        x = x.values
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(np.ascontiguousarray(x))
    return x.to(device=device, dtype=DTYPE)


def to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy()


def auto_chunk(bytes_per_head: float, device: torch.device) -> int:
    """Heads per chunk so the largest temporary stays near 16 MB (CPU) or 1 GB (GPU)."""
    budget = 2**30 if device.type == "cuda" else 16 * 2**20
    return max(1, int(budget // max(bytes_per_head, 1)))


def head_chunks(n_head: int, chunk: int | None):
    """Slices over the head axis, so memory stays bounded on large captures (0/None: all heads)."""
    chunk = n_head if not chunk else max(1, int(chunk))
    for start in range(0, n_head, chunk):
        yield slice(start, min(start + chunk, n_head))

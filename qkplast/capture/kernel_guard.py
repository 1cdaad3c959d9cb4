"""Kernel guard: refuse attention kernels whose memory grows as seq_len^2 at long lengths.

The capture runs the model's real attention kernel. Some kernels hold the
whole ``seq_len x seq_len`` score matrix per head: the eager path always, and
sdpa's *math* fallback, which PyTorch takes on CUDA when grouped-query
attention (``n_q != n_kv``) meets a dtype or GPU that its GQA-capable fast
kernel (flash attention: float16/bfloat16 on compute capability >= 8.0) cannot
serve. At 131072 tokens one score matrix is 64 GiB in float32, per head.

:func:`kernel_problem` decides from the settings alone (a pure function, so
every branch is unit-tested without a GPU); :func:`check_kernel` raises it.
:func:`restricted_sdpa` is the run-time backstop: on CUDA beyond the limit the
forward runs under ``torch.nn.attention.sdpa_kernel`` restricted to flash,
cuDNN and memory-efficient kernels, so an unforeseen fallback to the math
kernel fails at once instead of exhausting memory.

Memory of the linear-memory kernels on the CPU is measured by
``benchmarks/bench_scale.py``.
"""

from __future__ import annotations

import contextlib

from qkplast.errors import QkplastError

__all__ = [
    "QUADRATIC_LIMIT", "KernelError", "kernel_problem", "check_kernel", "restricts_kernels", "restricted_sdpa",
    "device_capability",
]

#: Longest sequence at which a kernel with seq_len^2 memory is still allowed (16K tokens:
#: one float32 score matrix per head is 1 GiB there, 64 GiB at 128K).
QUADRATIC_LIMIT = 16384

_FLASH_DTYPES = ("float16", "bfloat16")
_FLASH_MIN_CAPABILITY = (8, 0)


class KernelError(QkplastError):
    """The requested attention kernel would need memory quadratic in the sequence length."""


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _score_gib(seq_len: int, n_q: int, bytes_per: int) -> float:
    return seq_len * seq_len * n_q * bytes_per / 2**30


def kernel_problem(
    attn: str,
    dtype,
    device_type: str,
    capability: tuple[int, int] | None,
    seq_len: int,
    n_q: int,
    n_kv: int,
) -> str | None:
    """Why this configuration's attention memory would grow as ``seq_len^2`` past :data:`QUADRATIC_LIMIT`, or None.

    Parameters
    ----------
    attn : {"sdpa", "eager"}
        The kernel the capture hook delegates to.
    dtype : str or torch.dtype
        Compute dtype of the model (``"float32"``, ``torch.bfloat16``, ...).
    device_type : str
        ``"cpu"``, ``"cuda"``, ...
    capability : (major, minor) or None
        CUDA compute capability (None off CUDA or unknown: treated as flash-capable).
    seq_len, n_q, n_kv : int
        Window length and the query / key-value head counts (GQA when they differ).

    Returns
    -------
    str or None
        A one-line message naming the problem and the fix, or None when the kernel is linear in memory
        (or the length is within the limit).
    """
    if seq_len <= QUADRATIC_LIMIT:
        return None
    name = _dtype_name(dtype)
    if attn == "eager":
        per = 4 if name == "float32" else 2
        return (
            f"attn='eager' materialises the {seq_len} x {seq_len} attention matrix of every head "
            f"(~{_score_gib(seq_len, n_q, per):.0f} GiB per layer at {seq_len} tokens); use --attn sdpa, "
            f"or keep --seq-len at most {QUADRATIC_LIMIT}"
        )
    if device_type != "cuda" or n_q == n_kv:
        return None  # CPU sdpa (flash CPU kernel) and the memory-efficient CUDA kernel without GQA are linear
    if name not in _FLASH_DTYPES:
        return (
            f"sdpa in {name} with grouped-query attention ({n_q} query / {n_kv} key heads) on CUDA falls back to "
            f"the math kernel, whose memory grows as seq_len^2 (~{_score_gib(seq_len, n_q, 4):.0f} GiB per layer at "
            f"{seq_len} tokens); use --dtype bfloat16 (flash attention), or keep --seq-len at most {QUADRATIC_LIMIT}"
        )
    if capability is not None and tuple(capability) < _FLASH_MIN_CAPABILITY:
        major, minor = capability
        return (
            f"this GPU (compute capability {major}.{minor}) has no flash attention (needs 8.0+), so sdpa with "
            f"grouped-query attention ({n_q} query / {n_kv} key heads) falls back to the math kernel, whose memory "
            f"grows as seq_len^2 (~{_score_gib(seq_len, n_q, 2):.0f} GiB per layer at {seq_len} tokens); use an "
            f"Ampere or newer GPU (A100, H100), or keep --seq-len at most {QUADRATIC_LIMIT}"
        )
    return None


def check_kernel(attn, dtype, device_type, capability, seq_len, n_q, n_kv) -> None:
    """Raise :class:`KernelError` with :func:`kernel_problem`'s message when there is one."""
    problem = kernel_problem(attn, dtype, device_type, capability, seq_len, n_q, n_kv)
    if problem is not None:
        raise KernelError(problem)


def device_capability(device) -> tuple[int, int] | None:
    """CUDA compute capability of ``device``; None for any other device."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))


def restricts_kernels(device_type: str, seq_len: int) -> bool:
    """Whether the forward must run with sdpa restricted to linear-memory kernels (CUDA beyond the limit)."""
    return device_type == "cuda" and seq_len > QUADRATIC_LIMIT


def restricted_sdpa(device_type: str, seq_len: int):
    """A context that lets sdpa use only flash, cuDNN and memory-efficient kernels where :func:`restricts_kernels`.

    Elsewhere it does nothing: below the limit the math kernel's memory is
    affordable, and on the CPU sdpa's own kernel is linear.
    """
    if not restricts_kernels(device_type, seq_len):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])

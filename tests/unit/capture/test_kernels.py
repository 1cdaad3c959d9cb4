"""The kernel guard: every branch of the pure decision, and the CUDA-only restriction context."""

from __future__ import annotations

import contextlib

import pytest
import torch

from qkplast.errors import QkplastError
from qkplast.capture.kernel_guard import QUADRATIC_LIMIT, KernelError, check_kernel, kernel_problem, restricted_sdpa, restricts_kernels

LONG = 131072
A100, V100 = (8, 0), (7, 0)


def test_within_the_limit_everything_is_allowed():
    for attn in ("sdpa", "eager"):
        for dtype in ("float32", "bfloat16"):
            assert kernel_problem(attn, dtype, "cuda", V100, QUADRATIC_LIMIT, 32, 8) is None


def test_eager_is_refused_beyond_the_limit_on_every_device():
    for device, cap in (("cpu", None), ("cuda", A100)):
        problem = kernel_problem("eager", torch.bfloat16, device, cap, QUADRATIC_LIMIT + 1, 32, 8)
        assert problem is not None and "--attn sdpa" in problem and "\n" not in problem


def test_float32_gqa_on_cuda_is_refused_and_names_bfloat16():
    problem = kernel_problem("sdpa", "float32", "cuda", A100, LONG, 32, 8)
    assert "math kernel" in problem and "--dtype bfloat16" in problem
    assert "~2048 GiB" in problem  # 131072^2 x 32 heads x 4 bytes


def test_pre_ampere_gpu_with_gqa_is_refused():
    problem = kernel_problem("sdpa", "bfloat16", "cuda", V100, LONG, 32, 8)
    assert "compute capability 7.0" in problem and "Ampere" in problem


def test_linear_kernels_pass():
    assert kernel_problem("sdpa", "bfloat16", "cuda", A100, LONG, 32, 8) is None  # flash, GQA
    assert kernel_problem("sdpa", torch.float16, "cuda", (9, 0), LONG, 32, 8) is None
    assert kernel_problem("sdpa", "float32", "cuda", V100, LONG, 16, 16) is None  # no GQA: memory-efficient kernel
    assert kernel_problem("sdpa", "float32", "cpu", None, LONG, 32, 8) is None  # CPU flash kernel
    assert kernel_problem("sdpa", "bfloat16", "cuda", None, LONG, 32, 8) is None  # capability unknown


def test_check_kernel_raises_the_package_error():
    with pytest.raises(KernelError, match="attn='eager'") as info:
        check_kernel("eager", "float32", "cpu", None, LONG, 4, 2)
    assert isinstance(info.value, QkplastError)
    check_kernel("sdpa", "float32", "cpu", None, LONG, 4, 2)


def test_sdpa_restriction_applies_on_cuda_beyond_the_limit_only():
    assert restricts_kernels("cuda", QUADRATIC_LIMIT + 1)
    assert not restricts_kernels("cuda", QUADRATIC_LIMIT)
    assert not restricts_kernels("cpu", LONG)
    assert isinstance(restricted_sdpa("cpu", LONG), contextlib.nullcontext)
    # The restricted context itself can be entered without a GPU: it only sets the allowed backends.
    from torch.nn.attention import SDPBackend

    with restricted_sdpa("cuda", LONG):
        assert not torch.backends.cuda.math_sdp_enabled()
    assert torch.backends.cuda.math_sdp_enabled()
    assert SDPBackend.MATH not in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION)

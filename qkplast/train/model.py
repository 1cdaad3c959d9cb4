"""The miniature: a plain transformers ``LlamaForCausalLM`` built from a :class:`TrainConfig`, and its schedule.

Grouped-query attention, tied input and output embeddings, SwiGLU, RMSNorm, RoPE with the base of the stage
or arm; no dropout, so the only randomness of a training is the initialisation and the data order.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager

from qkplast.train.config import TrainConfig, TrainConfigError

__all__ = ["CPU_KERNEL_ENV", "build_model", "cpu_kernels", "deterministic", "llama_config", "lr_at",
           "parameter_count", "quiet_loading", "training_device"]

#: The environment of a CPU training process, set before torch is imported (ATen reads its capability once, MKL
#: its reproducibility mode at its first call): ATen's non-vectorised kernels and MKL's conditional numerical
#: reproducibility on the code path it keeps for every x86-64 CPU, Intel or AMD (torch's CPU wheels do every
#: float32 matrix product of the miniature in MKL's sgemm; oneDNN is not on its path). Threads come from
#: ``TrainConfig.threads``.
CPU_KERNEL_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}

#: ``mkl_cbwr_get``'s codes for the branches this module sets or meets (MKL's ``MKL_CBWR_*`` constants).
_MKL_BRANCHES = {0: "OFF", 1: "OFF", 2: "AUTO", 3: "COMPATIBLE"}


def llama_config(config: TrainConfig, arm: str, eot: int):
    """The ``LlamaConfig`` of stage A (``arm="stageA"``) or an extension arm: the same shapes, the arm's RoPE base.

    ``max_position_embeddings`` is the extension window for every checkpoint (so a stage-A checkpoint can be
    captured at the extension window too); the window each checkpoint was trained at is in ``training.json``.
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden, intermediate_size=config.ffn,
        num_hidden_layers=config.layers, num_attention_heads=config.heads, num_key_value_heads=config.kv_heads,
        head_dim=config.head_dim, max_position_embeddings=config.ext_window, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": config.theta_of(arm)},
        bos_token_id=eot, eos_token_id=eot, pad_token_id=None, attn_implementation="sdpa",
    )


def build_model(config: TrainConfig, arm: str, eot: int, seed: int | None = None):
    """A ``LlamaForCausalLM`` of the arm's config, initialised from ``seed`` (None: the caller loads weights)."""
    import torch
    from transformers import LlamaForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(config, arm, eot))


def parameter_count(config: TrainConfig) -> int:
    """Parameters of the miniature (tied embeddings counted once), from the shapes alone."""
    d, h = config.hidden, config.head_dim
    attention = d * h * (2 * config.heads + 2 * config.kv_heads)  # q, o and k, v projections
    mlp = 3 * d * config.ffn
    return config.vocab_size * d + config.layers * (attention + mlp + 2 * d) + d


def lr_at(step: int, peak: float, warmup: int, total: int, min_ratio: float, schedule: str = "cosine",
          decay_share: float = 0.2) -> float:
    """Learning rate of update ``step`` (0-based) of ``total``: a linear warm-up to ``peak``, then

    * ``cosine``: a cosine to ``min_ratio * peak`` at ``total``;
    * ``wsd`` (warmup-stable-decay): ``peak`` until the decay's first step ``D = total - round(decay_share *
      total)``, then ``peak (m + (1 - m)(1 - sqrt((step - D) / (total - D))))`` with ``m = min_ratio``: the
      ``1 - sqrt`` cool-down of Hägele et al. (2024), which falls fast at first and reaches ``m peak`` at ``total``.
    """
    if step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "wsd":
        start = total - round(decay_share * total)
        progress = max(step - start, 0) / max(total - start, 1)
        return peak * (min_ratio + (1 - min_ratio) * (1 - math.sqrt(progress)))
    progress = (step - warmup) / max(total - warmup, 1)
    return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@contextmanager
def quiet_loading():
    """transformers' loading and saving bars off inside the block (a checkpoint written or read every few
    steps would print two bars each beside the training's own); the caller's setting restored after."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


@contextmanager
def deterministic(threads: int, device: str = "cpu"):
    """Deterministic kernels and a fixed thread count inside the block (loading bars off); the caller's
    settings restored after. On ``cuda`` an operation torch has no deterministic kernel for warns instead of
    failing (a GPU run is seeded, not bitwise; see TrainConfig), and cuBLAS gets the fixed workspace its
    deterministic mode needs (read when its first handle is made, so before any GPU work)."""
    import torch

    if device == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True, warn_only=device == "cuda")
    try:
        with quiet_loading():
            yield
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])


def training_device(request: str) -> str:
    """``cpu`` or ``cuda`` for a ``TrainConfig.device`` request (``auto``: ``cuda`` when torch sees a GPU).

    Asks ``torch.cuda.is_available()``, which counts devices without making a CUDA context, so a parent
    process may call it before spawning the workers that use the GPU.

    Raises
    ------
    TrainConfigError
        ``cuda`` is requested and torch sees no GPU.
    """
    import torch

    if request == "cpu":
        return "cpu"
    available = torch.cuda.is_available()
    if request == "cuda" and not available:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
        raise TrainConfigError(f"device 'cuda' requested but torch {torch.__version__} ({build}) sees no GPU; "
                               "pass --device cpu (or auto)")
    return "cuda" if available else "cpu"


def cpu_kernels() -> dict:
    """The CPU kernel settings in force in this process: ``{"cpu_capability": ATen's (DEFAULT, AVX2, ...),
    "mkl_cbwr": MKL's reproducibility branch (COMPATIBLE, AUTO, OFF; None without MKL)}``, read from the
    libraries themselves, not from the environment."""
    import ctypes

    import torch

    mkl = None
    if torch.backends.mkl.is_available():
        try:  # torch's CPU library carries MKL's service functions
            lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
            code = lib.mkl_serv_cbwr_get(1)  # MKL_CBWR_BRANCH
            mkl = _MKL_BRANCHES.get(code, str(code))
        except (OSError, AttributeError):
            mkl = None
    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": mkl}

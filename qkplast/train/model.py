"""The miniature: a plain transformers ``LlamaForCausalLM`` built from a :class:`TrainConfig`, and its schedule.

Grouped-query attention, tied input and output embeddings, SwiGLU, RMSNorm, RoPE with the base of the stage
or arm; no dropout, so the only randomness of a training is the initialisation and the data order.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

from qkplast.train.config import TrainConfig

__all__ = ["build_model", "deterministic", "llama_config", "lr_at", "parameter_count", "quiet_loading"]


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


def lr_at(step: int, peak: float, warmup: int, total: int, min_ratio: float) -> float:
    """Learning rate of update ``step`` (0-based): linear warm-up to ``peak``, then a cosine to ``min_ratio * peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
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
def deterministic(threads: int):
    """Deterministic kernels and a fixed thread count inside the block (loading bars off); the caller's
    settings restored after."""
    import torch

    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        with quiet_loading():
            yield
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])

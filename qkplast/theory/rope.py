"""A model's own rotary position embedding (thesis section 2.3): the relative-position
property (eq. 2.6) and the frequency structure.

The rotary module and ``apply_rotary_pos_emb`` are taken from the model's own
transformers modeling file, so what is shown is what the model computes.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from qkplast.theory.checks import CheckResult


@dataclass
class Rotary:
    """A model's rotary embedding: the module, its ``apply_rotary_pos_emb`` and config facts."""

    module: torch.nn.Module
    apply: object
    head_dim: int
    theta: float
    max_positions: int
    inv_freq: np.ndarray  # [head_dim / 2], float64 copy of the module's buffer
    model_type: str

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` ``[n, head_dim]`` to ``positions`` ``[n]`` with the model's own code (float32)."""
        x = x.to(torch.float32)[None, None]  # [batch, head, n, dim]
        cos, sin = self.module(x, positions[None].to(torch.long))
        out, _ = self.apply(x, x, cos, sin)
        return out[0, 0]


def model_config(model, revision: str | None = None, rope_scaling: str | dict | None = None):
    """The full config and the text config of ``model`` as a capture would load them.

    ``model`` is the embedded alias, a local directory, a hub id (``owner/name@revision`` too), resolved by
    :func:`qkplast.capture.models.load_config`, or a config object; ``rope_scaling`` (``TYPE:FACTOR[:ORIGINAL]``)
    is applied as the capture applies it.
    """
    from qkplast.capture.models import apply_rope_scaling, load_config, parse_rope_scaling

    if isinstance(model, str):
        config, _ = load_config(model, revision=revision, rope_scaling=rope_scaling)
    else:
        config, scaling = model, parse_rope_scaling(rope_scaling)
        if scaling is not None:
            apply_rope_scaling(config, scaling)
    return config, config.get_text_config()


def _modeling_module(config, text):
    """The transformers modeling module that defines the text model's rotary embedding.

    A composite model (Llama 3.2 Vision: ``mllama`` with text config ``mllama_text_model``) keeps it in the
    modeling file of the outer model type, so both names are tried.
    """
    for model_type in dict.fromkeys((text.model_type, config.model_type, text.model_type.split("_")[0])):
        try:
            return importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
        except ModuleNotFoundError:
            continue
    raise ValueError(f"no transformers modeling module for model type {text.model_type!r} ({config.model_type!r})")


def model_rotary(model="smollm2-135m", revision: str | None = None, rope_scaling: str | dict | None = None) -> Rotary:
    """Instantiate ``model``'s rotary embedding class from its transformers modeling module.

    ``revision`` and ``rope_scaling`` are those of the capture, so the embedding is the one it ran.
    """
    config, text = model_config(model, revision, rope_scaling)
    mod = _modeling_module(config, text)
    classes = [getattr(mod, n) for n in dir(mod)
               if n.endswith("RotaryEmbedding") and not n.startswith("_") and "Vision" not in n]
    if not classes or not hasattr(mod, "apply_rotary_pos_emb"):
        raise ValueError(f"model type {text.model_type!r} has no rotary embedding in its modeling file")
    module = classes[0](config=text)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    params = getattr(text, "rope_parameters", None) or {}
    theta = float(params.get("rope_theta", getattr(text, "rope_theta", float("nan"))))
    return Rotary(module, mod.apply_rotary_pos_emb, head_dim, theta, int(text.max_position_embeddings),
                  module.inv_freq.double().numpy(), text.model_type)


def frequency_table(rope: Rotary, context: int | None = None) -> pd.DataFrame:
    """Per rotation pair k: angular frequency theta_k, wavelength ``2 pi / theta_k`` in tokens, and
    the number of full turns over ``context`` tokens (default: the model's maximum)."""
    context = context or rope.max_positions
    wavelength = 2 * math.pi / rope.inv_freq
    return pd.DataFrame({
        "pair": np.arange(len(rope.inv_freq)), "theta": rope.inv_freq, "wavelength_tokens": wavelength,
        "turns_over_context": context / wavelength,
    }).set_index("pair")


def check_relative_property(rope: Rotary, n: int = 256, max_position: int | None = None, seed: int = 0,
                            rtol: float = 1e-4) -> CheckResult:
    """Eq. 2.6: ``RoPE(q, t)^T RoPE(k, i)`` depends on ``t - i`` only.

    Draws ``n`` random ``(q, k, t, i, s)`` and compares the score at ``(t, i)``
    with the score at ``(t + s, i + s)``, both computed by the model's own
    float32 code. The deviation is reported relative to ``|q| |k|``; float32
    angles ``t * theta`` carry an absolute error of about ``t * 6e-8`` rad,
    so the tolerance ``rtol`` scales with ``max_position``.
    """
    rng = np.random.default_rng(seed)
    top = max_position or rope.max_positions
    q = torch.as_tensor(rng.normal(size=(n, rope.head_dim)))
    k = torch.as_tensor(rng.normal(size=(n, rope.head_dim)))
    t = rng.integers(0, top // 2, n)
    i = rng.integers(0, top // 2, n)
    s = rng.integers(0, top // 2, n)
    score = lambda a, b: (rope.rotate(q, torch.as_tensor(a)) * rope.rotate(k, torch.as_tensor(b))).sum(-1).double()  # noqa: E731
    base, shifted = score(t, i), score(t + s, i + s)
    norm = (q.norm(dim=-1) * k.norm(dim=-1))
    rel = ((base - shifted).abs() / norm).numpy()
    # YaRN and friends scale cos and sin by ``attention_scaling``, so at t = i = 0 the score is q.k times its square
    exact = (q * k).sum(-1).double() * float(getattr(rope.module, "attention_scaling", 1.0)) ** 2
    same = score(np.zeros(n, int), np.zeros(n, int))  # at t = i = 0 the rotation is the identity
    table = pd.DataFrame({"t": t, "i": i, "shift": s, "score": base.numpy(), "score_shifted": shifted.numpy(),
                          "relative_deviation": rel})
    passed = bool(rel.max() < rtol) and bool(torch.allclose(same, exact, rtol=1e-5, atol=1e-5))
    return CheckResult(
        "eq. 2.6 (relative position)", passed,
        f"max |score(t,i) - score(t+s,i+s)| / (|q||k|) = {rel.max():.2e} over {n} random draws up to position "
        f"{top} (tolerance {rtol:g}, float32 rotary code)", table, {"max_relative_deviation": float(rel.max())})

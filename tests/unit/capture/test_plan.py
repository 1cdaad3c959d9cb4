"""The planner: layout and heads from the config alone, memory arithmetic, the refusals, the table."""

from __future__ import annotations

import pytest
import transformers as T

from qkplast.capture.architecture import inspect_model, architecture_from_config
from qkplast.capture.plan import live_elements_per_token
from tests.helpers import QWEN3_8B, tiny_model


@pytest.mark.parametrize("family", ["llama", "qwen3", "ministral", "mistral-swa", "smollm3", "mllama", "mistral3"])
def test_architecture_from_config_predicts_the_probe(family):
    model = tiny_model(family)
    predicted = architecture_from_config(model.config)
    if family == "mistral-swa":  # every layer sliding: the probe refuses, the prediction has none eligible
        assert predicted.eligible_layers == []
        return
    observed = inspect_model(model)
    assert predicted.layers == observed.layers
    assert (predicted.n_q_heads, predicted.n_kv_heads, predicted.head_dim, predicted.family) == (
        observed.n_q_heads, observed.n_kv_heads, observed.head_dim, observed.family)


def test_live_elements_count_the_larger_phase():
    config = T.Qwen3Config(**QWEN3_8B)
    h, i, d = 4096, 12288, 128
    assert live_elements_per_token(config) == 2 * h + 2 * d + (h + 3 * i + h)  # the MLP phase is the larger
    small_mlp = T.LlamaConfig(hidden_size=64, intermediate_size=8, num_attention_heads=8, num_key_value_heads=8)
    attention = 64 + 2 * (8 + 16) * 8 + 64 + 64
    assert live_elements_per_token(small_mlp) == 2 * 64 + 2 * 8 + attention

"""The planner: layout and heads from the config alone, memory arithmetic, the refusals, the table."""

from __future__ import annotations

import pytest
import transformers as T

from qkplast.capture.architecture import inspect_model, layout_from_config
from qkplast.options import CaptureOptions
from qkplast.capture.plan import KAPPA, PlanError, live_elements_per_token, plan_capture
from test_capture import tiny_model, tiny_tokenizer

# Qwen3-8B's published dimensions: the thesis's model at its scale, config only (no weights needed to plan).
QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
                tie_word_embeddings=False)


@pytest.fixture(scope="module")
def qwen3_8b_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-8b-config")
    T.Qwen3Config(**{**QWEN3_8B, "vocab_size": 300}).save_pretrained(path)  # the tiny tokenizer's vocabulary
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.mark.parametrize("family", ["llama", "qwen3", "ministral", "mistral-swa", "smollm3", "mllama", "mistral3"])
def test_layout_from_config_predicts_the_probe(family):
    model = tiny_model(family)
    predicted = layout_from_config(model.config)
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


def _options(path, **kw):
    base = dict(model=str(path), seq_len=131072, bucket_size=8192, rope_scaling="yarn:4:32768", corpus="pydoc-topics",
                short_docs="concat", docs=1, device="cuda", dtype="bfloat16", heads=300)
    return CaptureOptions(**{**base, **kw})


@pytest.mark.integration
def test_thesis_scale_plan_on_an_80_gb_gpu(qwen3_8b_dir):
    plan = plan_capture(_options(qwen3_8b_dir), device_memory_gb=80)
    assert plan.windows == 1 and plan.heads == 300 and plan.heads_eligible == 36 * 32
    # Qwen3-8B has 8,190,735,360 parameters; here its two 151936-row embeddings have the tokenizer's 300 rows.
    assert plan.n_params == 8_190_735_360 - 2 * (151936 - 300) * 4096
    assert plan.weights_gb == pytest.approx(plan.n_params * 2 / 2**30)
    per_token = KAPPA * live_elements_per_token(T.Qwen3Config(**QWEN3_8B)) * 2 + 4 * 32
    assert plan.activations_gb == pytest.approx(per_token * 131072 / 2**30)
    assert plan.peak_gb < 80 and plan.kernel_problem is None
    plan.check()
    table = str(plan)
    for row in ("heads sampled / eligible", "300 / 1152", "expected peak", "verdict", "fits"):
        assert row in table


@pytest.mark.integration
def test_refusals_name_the_fix(qwen3_8b_dir):
    with pytest.raises(PlanError, match=r"exceeds the 24\.0 GiB of cuda"):
        plan_capture(_options(qwen3_8b_dir), device_memory_gb=24).check()
    with pytest.raises(PlanError, match="--dtype bfloat16"):
        plan_capture(_options(qwen3_8b_dir, dtype="float32"), device_memory_gb=1000).check()
    with pytest.raises(PlanError, match="--attn sdpa"):
        plan_capture(_options(qwen3_8b_dir, attn="eager", device="cpu", dtype="float32"), device_memory_gb=1000).check()
    short = plan_capture(_options(qwen3_8b_dir, docs=50), device_memory_gb=80)
    assert short.windows < 50
    with pytest.raises(PlanError, match="yields .* window"):
        short.check()

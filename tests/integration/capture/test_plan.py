"""The planner on a Qwen3-8B config read from disk: the thesis-scale plan and the refusals that name the fix."""

from __future__ import annotations

import pytest
import transformers as T

from qkplast.capture.plan import KAPPA, PlanError, live_elements_per_token, plan_capture
from qkplast.options import CaptureOptions
from tests.helpers import QWEN3_8B, tiny_tokenizer


@pytest.fixture(scope="module")
def qwen3_8b_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-8b-config")
    T.Qwen3Config(**{**QWEN3_8B, "vocab_size": 300}).save_pretrained(path)  # the tiny tokenizer's vocabulary
    tiny_tokenizer().save_pretrained(path)
    return path


def _options(path, **kw):
    base = dict(model=str(path), seq_len=131072, bucket_size=8192, rope_scaling="yarn:4:32768", corpus="pydoc-topics",
                short_docs="concat", docs=1, device="cuda", dtype="bfloat16", heads=300)
    return CaptureOptions(**{**base, **kw})


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

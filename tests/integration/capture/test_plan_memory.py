"""Issue 23, the thesis-scale path without a GPU: the code capture sized to its corpus, the memory plan
(refusal, float32 upcasts, LM-head chunks, several GPUs), studies validated before submission (SLURM keys and
dry run, pinned and floating revisions, the commit a requeued job checks), local jobs one GPU each, progress
lines, and the GPU cache emptied before the notebooks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers as T
import yaml

from qkplast.capture.plan import (activation_bytes_per_token)
from tests.helpers import ROOT
from tests.helpers import COMMON, tiny_tokenizer

QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960)


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    """A tiny Llama's config and tokenizer, no weights: all that planning, sizing and validation read."""
    path = tmp_path_factory.mktemp("tiny-config")
    T.LlamaConfig(**COMMON).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _jsonl(path: Path, sizes: list[int]) -> Path:
    """Documents of natural prose of the given character counts (the tiny BPE: ~1.5 characters per token)."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics)) * 4
    with path.open("w") as f:
        for i, n in enumerate(sizes):
            f.write(json.dumps({"id": f"d{i}", "text": text[i * 997: i * 997 + n]}) + "\n")
    return path


# --------------------------------------------------------------------------- 1. the code capture


# --------------------------------------------------------------------------- 7. memory


# --------------------------------------------------------------------------- 5, 6, 9. studies


def _study(tmp_path, models, **top) -> Path:
    data = {"name": "s", "out": str(tmp_path / "out"), "models": models, **top}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --------------------------------------------------------------------------- 4. local jobs on a GPU host


# --------------------------------------------------------------------------- 6. progress lines, 12. GPU cache


@pytest.mark.parametrize("arch, dtype", [("qwen3", "float32"), ("smollm3", "float32"), ("mllama", "float32"),
                                         ("qwen3", "bfloat16")])
def test_the_plan_is_within_15_percent_of_the_measured_peak_on_the_rehearsal_models(arch, dtype, tmp_path):
    """The peak-RSS slope of a bare forward between 8192 and 32768 tokens (each length in a fresh process, as
    ``benchmarks/bench_scale.py --kappa`` measures it) against the plan's activation bytes per token."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_scale

    from tests.hub_fixtures import tiny_config

    measured = bench_scale.measure_slope(arch, (8192, 32768), dtype)
    planned = activation_bytes_per_token(tiny_config(arch), dtype, "cpu")
    assert 0.85 <= measured / planned <= 1.15, (arch, dtype, measured, planned)

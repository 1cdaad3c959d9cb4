"""Issue 23, the thesis-scale path without a GPU: the code capture sized to its corpus, the memory plan
(refusal, float32 upcasts, LM-head chunks, several GPUs), studies validated before submission (SLURM keys and
dry run, pinned and floating revisions, the commit a requeued job checks), local jobs one GPU each, progress
lines, and the GPU cache emptied before the notebooks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import transformers as T
import yaml

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


def test_local_jobs_on_a_gpu_host_get_one_gpu_each(tmp_path, config_dir):
    """Three runs of one GPU each, four allowed at once, two GPUs visible: two waves, each job its own device."""
    import subprocess
    import sys

    import transformers as T

    from tests.helpers import COMMON

    model = tmp_path / "tiny"
    T.LlamaForCausalLM(T.LlamaConfig(**COMMON)).save_pretrained(model)
    tiny_tokenizer().save_pretrained(model)
    path = _study(tmp_path, [{"id": str(model), "name": n, "seed": i} for i, n in enumerate("abc")],
                  defaults={"corpus": "pydoc-topics", "short_docs": "concat", "docs": 2, "seq_len": 64,
                            "bucket_size": 16, "samples_per_bucket": 2, "heads": 4, "device": "cpu"},
                  resources={"gpus": 1, "array_parallelism": 4, "timeout_min": 10})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "0,1",
           "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "qkplast.pipeline.cli", "study", str(path), "--executor", "local",
                        "--stage", "capture"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    attempts = {n: [json.loads(x) for x in (tmp_path / "out" / n / "study-attempts.jsonl").read_text().splitlines()]
                for n in "abc"}
    assert [attempts[n][0]["cuda_visible_devices"] for n in "abc"] == ["0", "1", "0"]
    # the third started only after the first wave ended: never three jobs on two GPUs
    finished = {n: json.loads((tmp_path / "out" / n / "study-done.json").read_text())["finished"] for n in "ab"}
    assert attempts["c"][0]["started"] >= max(finished.values())
    dry = subprocess.run([sys.executable, "-m", "qkplast.pipeline.cli", "study", str(path), "--executor", "local",
                          "--dry-run", "--stage", "analyze"], env=env, capture_output=True, text=True, timeout=600)
    assert "wave 1: a (CUDA_VISIBLE_DEVICES=0), b (CUDA_VISIBLE_DEVICES=1)" in dry.stdout, dry.stdout + dry.stderr



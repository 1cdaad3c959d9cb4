"""``CaptureOptions.tokenizer``: a checkpoint branch without a tokenizer captured with another repository's or
directory's, the tokenizer and its commit recorded in the capture attrs (issue 23, item 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest


from tests.hub_fixtures import save_to_hub_cache, tiny_model, tiny_tokenizer  # noqa: E402
from qkplast.capture.driver import run_capture  # noqa: E402
from qkplast.capture.models import ModelError, load_model  # noqa: E402
from qkplast.capture_format import CaptureError, validate_capture  # noqa: E402
from qkplast.options import CaptureOptions  # noqa: E402

pytestmark = pytest.mark.integration

CHECKPOINTS, BASE, BRANCH = "owner/tiny-checkpoints", "owner/tiny-base", "stage1-step-100"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A checkpoint branch saved without a tokenizer, and the base repository holding one (main)."""
    cache = tmp_path_factory.mktemp("hub")
    tokenizer = tiny_tokenizer()
    branch = save_to_hub_cache(tiny_model("llama3"), None, CHECKPOINTS, cache, BRANCH)
    base = save_to_hub_cache(None, tokenizer, BASE, cache, "main")
    directory = tmp_path_factory.mktemp("tokenizer-dir")
    tokenizer.save_pretrained(directory)
    corpus = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
    from pydoc_data.topics import topics

    corpus.write_text("\n".join(json.dumps({"id": k, "text": topics[k] * 4}) for k in ("assert", "for")))
    return cache, {"branch": branch, "base": base}, directory, corpus


@pytest.fixture
def cached(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub[0]))
    return hub


def _options(corpus, **kw) -> CaptureOptions:
    return CaptureOptions(model=f"{CHECKPOINTS}@{BRANCH}", corpus=str(corpus), docs=2, seq_len=256, bucket_size=16,
                          samples_per_bucket=2, heads=None, device="cpu", **kw)


def test_a_branch_without_tokenizer_is_refused_naming_the_option(cached, tmp_path):
    _, _, _, corpus = cached
    with pytest.raises(ModelError, match="--tokenizer OWNER/NAME@REVISION") as info:
        run_capture(_options(corpus), tmp_path / "c.nc", progress=False)
    assert "\n" not in str(info.value) and not (tmp_path / "c.nc").exists()


@pytest.mark.parametrize("source", ["hub", "directory"])
def test_the_named_tokenizer_reads_the_corpus_and_is_recorded(cached, tmp_path, source):
    _, commits, directory, corpus = cached
    spec = f"{BASE}@main" if source == "hub" else str(directory)
    ds = validate_capture(run_capture(_options(corpus, tokenizer=spec), tmp_path / "c.nc", progress=False))
    assert ds.attrs["tokenizer"] == spec and ds.attrs["commit"] == commits["branch"]
    assert ds.attrs["tokenizer_commit"] == (commits["base"] if source == "hub" else None)
    from qkplast.capture.corpus import iter_windows, open_corpus

    for window in iter_windows(open_corpus(str(corpus)), tiny_tokenizer(), 256):  # the windows that tokenizer cuts
        sel = ds.doc.values == window.doc_id
        np.testing.assert_array_equal(ds.token.values[sel], window.input_ids[ds.position.values[sel]])


def test_a_loaded_model_with_another_tokenizer_is_refused(cached, tmp_path):
    _, _, directory, corpus = cached
    loaded = load_model(f"{CHECKPOINTS}@{BRANCH}", tokenizer=f"{BASE}@main")
    assert loaded.info["tokenizer"] == f"{BASE}@main" and loaded.info["tokenizer_commit"]
    with pytest.raises(CaptureError, match="carries tokenizer"):
        run_capture(_options(corpus, tokenizer=str(directory)), tmp_path / "c.nc", progress=False, loaded=loaded)

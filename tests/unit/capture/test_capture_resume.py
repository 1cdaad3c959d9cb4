"""Refusal of bad input before any weight loads, without half-written output (resuming: tests/integration/capture)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qkplast.capture.corpus import CorpusError
from qkplast.capture.models import ModelError
from tests.helpers import files_written, run_tiny_capture


def test_unknown_model_or_path(tmp_path):
    out = tmp_path / "cap.nc"
    with pytest.raises(ModelError, match="unknown model 'no-such-model'"):
        run_tiny_capture("no-such-model", out)
    with pytest.raises(ModelError, match="unknown model"):
        run_tiny_capture(tmp_path / "missing" / "dir", out)
    with pytest.raises(ModelError, match="cannot load the config of model 'nobody/no-such-model'"):
        run_tiny_capture("nobody/no-such-model", out)  # the hub is offline in tests
    (tmp_path / "gpt2").mkdir()
    with pytest.raises(ModelError, match="has no config.json"):
        run_tiny_capture(tmp_path / "gpt2", out)
    assert files_written(tmp_path) == []


def test_sequence_too_long(model_dir, tmp_path):
    with pytest.raises(ModelError, match="seq_len 512 exceeds the model's maximum of 256 positions.*--rope-scaling"):
        run_tiny_capture(model_dir, tmp_path / "cap.nc", seq_len=512)
    assert files_written(tmp_path) == []


def test_empty_corpus(model_dir, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "empty.txt").write_text("  \n")
    (corpus / "short.txt").write_text("too short")
    with pytest.raises(CorpusError, match="yields 0 window.*of 64 tokens"):  # found by tokenizing, before any weight
        run_tiny_capture(model_dir, tmp_path / "cap.nc", corpus)
    assert files_written(tmp_path) == []
    (corpus / "empty.txt").unlink()
    (corpus / "short.txt").unlink()
    with pytest.raises(CorpusError, match="holds no .txt or .jsonl files"):
        run_tiny_capture(model_dir, tmp_path / "cap.nc", corpus)


def test_unwritable_output(model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="output directory .* does not exist"):
        run_tiny_capture(model_dir, tmp_path / "missing" / "cap.nc")
    with pytest.raises(IsADirectoryError):
        run_tiny_capture(model_dir, tmp_path, overwrite=True)
    if Path("/proc").is_dir():  # a directory nobody, not even root, can create files in
        with pytest.raises(PermissionError, match="/proc is not writable"):
            run_tiny_capture(model_dir, "/proc/cap.nc")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root): no unwritable directory to test")
        with pytest.raises(PermissionError, match="not writable"):
            run_tiny_capture(model_dir, locked / "cap.nc")
    finally:
        locked.chmod(0o700)

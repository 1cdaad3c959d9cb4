"""Streaming, kill-and-resume, the command line, and refusal of bad input without half-written output."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import transformers as T

from qkplast._capture_cli import add_capture_parser, add_prepare_parser
from qkplast.capture import UnsupportedModelError, run_capture
from qkplast.corpus import CorpusError
from qkplast.io import CaptureError, open_capture
from qkplast.models import ModelError
from test_capture import COMMON, tiny_tokenizer

ARGS = dict(seq_len=64, bucket_size=16, samples_per_bucket=2, heads=5, docs=12, progress=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny random Llama checkpoint with its tokenizer, saved like a downloaded model."""
    path = tmp_path_factory.mktemp("tiny-llama")
    T.LlamaForCausalLM(T.LlamaConfig(**COMMON)).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    """An uninterrupted capture of the first 12 pydoc-topics windows."""
    out = tmp_path_factory.mktemp("reference") / "ref.nc"
    run_capture(str(model_dir), "pydoc-topics", out, **ARGS)
    return open_capture(out)


_CHILD = textwrap.dedent(
    """
    import sys, time
    import qkplast.capture as c

    write = c.save_dataset
    def slow_write(*args, **kwargs):  # widens the window in which the parent kills the run
        path = write(*args, **kwargs)
        time.sleep(0.15)
        return path
    c.save_dataset = slow_write
    c.run_capture(sys.argv[1], "pydoc-topics", sys.argv[2], **{args})
    """
).format(args=ARGS)


def _assert_same_capture(a, b):
    assert a.attrs == b.attrs
    for name in ("q", "k", "position", "doc", "bucket", "token", "layer", "q_head", "kv_head", "rope"):
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)


def test_killed_capture_resumes_to_the_uninterrupted_result(model_dir, reference, tmp_path):
    out = tmp_path / "cap.nc"
    parts = tmp_path / "cap.nc.parts"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    # Kill at several moments: before the first part, after a few parts, possibly while writing one.
    for delay_after_first_part in (None, 0.0, 0.2, 0.45):
        proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(model_dir), str(out)], env=env)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if delay_after_first_part is None or any(parts.glob("doc-*.nc")):
                break
            time.sleep(0.01)
        time.sleep(delay_after_first_part or 0.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not out.exists(), "a killed run must not leave a final capture"
    done_before_resume = len(list(parts.glob("doc-*.nc")))
    assert 0 < done_before_resume < 12
    resumed = run_capture(str(model_dir), "pydoc-topics", out, **ARGS)
    assert not parts.exists()
    _assert_same_capture(open_capture(out), reference)
    _assert_same_capture(resumed, reference)


def test_resume_reuses_every_part_including_documents_without_samples(model_dir, tmp_path, monkeypatch):
    import qkplast.capture as capture_module

    args = {**ARGS, "samples_per_bucket": 0.1}  # most 64-token documents get no sample at all
    expected = run_capture(str(model_dir), "pydoc-topics", tmp_path / "ref.nc", **args)
    assert expected.attrs["n_docs"] == 12 and 0 < len(set(expected["doc"].values)) < 12
    out, parts = tmp_path / "cap.nc", tmp_path / "cap.nc.parts"

    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(capture_module, "save_capture", disk_full)
    with pytest.raises(OSError, match="disk full"):
        run_capture(str(model_dir), "pydoc-topics", out, **args)
    assert not out.exists() and len(list(parts.glob("doc-*.nc"))) == 12
    monkeypatch.undo()

    def no_forward(*args, **kwargs):
        raise AssertionError("every document is already in the parts; nothing should be recomputed")

    monkeypatch.setattr(capture_module.Capturer, "capture_window", no_forward)
    _assert_same_capture(run_capture(str(model_dir), "pydoc-topics", out, **args), expected)
    assert not parts.exists()


def test_parts_from_other_arguments_are_refused(model_dir, tmp_path):
    out = tmp_path / "cap.nc"
    parts = tmp_path / "cap.nc.parts"
    parts.mkdir()
    (parts / "manifest.json").write_text('{"seed": 1}')
    with pytest.raises(CaptureError, match="different arguments.*seed"):
        run_capture(str(model_dir), "pydoc-topics", out, **ARGS)
    assert (parts / "manifest.json").exists() and not out.exists()
    run_capture(str(model_dir), "pydoc-topics", out, overwrite=True, **ARGS)
    assert out.exists() and not parts.exists()


def test_existing_output_is_kept_without_overwrite(model_dir, tmp_path):
    out = tmp_path / "cap.nc"
    out.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="--overwrite"):
        run_capture(str(model_dir), "pydoc-topics", out, **ARGS)
    assert out.read_bytes() == b"precious"
    run_capture(str(model_dir), "pydoc-topics", out, overwrite=True, **ARGS)
    assert open_capture(out).attrs["n_docs"] == 12


def _nothing_written(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name not in ("corpus", "gpt2"))


def test_unknown_model_or_path(tmp_path):
    out = tmp_path / "cap.nc"
    with pytest.raises(ModelError, match="unknown model 'no-such-model'"):
        run_capture("no-such-model", "pydoc-topics", out, **ARGS)
    with pytest.raises(ModelError, match="unknown model"):
        run_capture(str(tmp_path / "missing" / "dir"), "pydoc-topics", out, **ARGS)
    with pytest.raises(ModelError, match="cannot load the config of model 'nobody/no-such-model'"):
        run_capture("nobody/no-such-model", "pydoc-topics", out, **ARGS)  # the hub is offline in tests
    (tmp_path / "gpt2").mkdir()
    with pytest.raises(ModelError, match="has no config.json"):
        run_capture(str(tmp_path / "gpt2"), "pydoc-topics", out, **ARGS)
    assert _nothing_written(tmp_path) == []


def test_unsupported_architecture(tmp_path):
    config = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=300, n_positions=128)
    T.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    tiny_tokenizer().save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UnsupportedModelError, match=r"'gpt2'.*supported: Llama 3\.x.*Llama 3\.2 Vision"):
        run_capture(str(tmp_path / "gpt2"), "pydoc-topics", tmp_path / "cap.nc", **ARGS)
    assert _nothing_written(tmp_path) == []


def test_sequence_too_long(model_dir, tmp_path):
    with pytest.raises(ModelError, match="seq_len 512 exceeds the model's maximum of 256 positions.*--rope-scaling"):
        run_capture(str(model_dir), "pydoc-topics", tmp_path / "cap.nc", **{**ARGS, "seq_len": 512})
    assert _nothing_written(tmp_path) == []


def test_empty_corpus(model_dir, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "empty.txt").write_text("  \n")
    (corpus / "short.txt").write_text("too short")
    with pytest.raises(CaptureError, match="gave no window of 64 tokens.*1 empty.*1 short ones left over"):
        run_capture(str(model_dir), str(corpus), tmp_path / "cap.nc", **ARGS)
    assert _nothing_written(tmp_path) == []
    (corpus / "empty.txt").unlink()
    (corpus / "short.txt").unlink()
    with pytest.raises(CorpusError, match="holds no .txt or .jsonl files"):
        run_capture(str(model_dir), str(corpus), tmp_path / "cap.nc", **ARGS)


def test_unwritable_output(model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="output directory .* does not exist"):
        run_capture(str(model_dir), "pydoc-topics", tmp_path / "missing" / "cap.nc", **ARGS)
    with pytest.raises(IsADirectoryError):
        run_capture(str(model_dir), "pydoc-topics", tmp_path, overwrite=True, **ARGS)
    if Path("/proc").is_dir():  # a directory nobody, not even root, can create files in
        with pytest.raises(PermissionError, match="/proc is not writable"):
            run_capture(str(model_dir), "pydoc-topics", "/proc/cap.nc", **ARGS)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root): no unwritable directory to test")
        with pytest.raises(PermissionError, match="not writable"):
            run_capture(str(model_dir), "pydoc-topics", locked / "cap.nc", **ARGS)
    finally:
        locked.chmod(0o700)


def _cli(argv):
    parser = argparse.ArgumentParser(prog="qkplast")
    sub = parser.add_subparsers(dest="command", required=True)
    add_capture_parser(sub)
    add_prepare_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_capture_and_errors(model_dir, reference, tmp_path, capsys):
    out = tmp_path / "cli.nc"
    argv = ["capture", "--model", str(model_dir), "--corpus", "pydoc-topics", "--out", str(out)]
    argv += ["--seq-len", "64", "--bucket-size", "16", "--samples-per-bucket", "2", "--heads", "5", "--docs", "12"]
    assert _cli(argv + ["--no-progress"]) == 0
    assert "captured 5 heads" in capsys.readouterr().out
    _assert_same_capture(open_capture(out), reference)
    assert _cli(argv + ["--no-progress"]) == 2
    assert "exists; pass overwrite=True (CLI: --overwrite)" in capsys.readouterr().err
    assert _cli(["capture", "--model", "no-such-model", "--out", str(tmp_path / "x.nc")]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _cli(["capture", "--out", "x.nc", "--heads", "0"])
    args = argparse.ArgumentParser()
    sub = args.add_subparsers()
    add_capture_parser(sub)
    parsed = args.parse_args(["capture", "--out", "x.nc"])
    assert (parsed.model, parsed.corpus, parsed.heads, parsed.seed, parsed.device, parsed.dtype, parsed.attn) == (
        "smollm2-135m",
        "pydoc-topics",
        300,
        0,
        "auto",
        "auto",
        "sdpa",
    )

"""Streaming, kill-and-resume, the command line, and refusal of bad input without half-written output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import transformers as T

from qkplast.capture.driver import UnsupportedModelError, run_capture
from qkplast.capture_format import CaptureError, open_capture
from qkplast.options import CaptureOptions
from tests.helpers import ROOT, TINY_CAPTURE, files_written, run_tiny_capture, tiny_tokenizer


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    """An uninterrupted capture of the first 12 pydoc-topics windows."""
    out = tmp_path_factory.mktemp("reference") / "ref.nc"
    run_tiny_capture(model_dir, out)
    return open_capture(out)


_CHILD = textwrap.dedent(
    """
    import sys, time
    import qkplast.capture.driver as c
    import qkplast.capture.resume as parts
    from qkplast.options import CaptureOptions

    write = parts.save_dataset
    def slow_write(*args, **kwargs):  # widens the window in which the parent kills the run
        path = write(*args, **kwargs)
        time.sleep(0.15)
        return path
    parts.save_dataset = slow_write
    c.run_capture(CaptureOptions(model=sys.argv[1], **{args}), sys.argv[2], progress=False)
    """
).format(args=TINY_CAPTURE)


def _assert_same_capture(a, b):
    assert a.attrs == b.attrs
    for name in ("q", "k", "position", "doc", "bucket", "token", "layer", "q_head", "kv_head", "rope"):
        np.testing.assert_array_equal(a[name].values, b[name].values, err_msg=name)


def test_killed_capture_resumes_to_the_uninterrupted_result(model_dir, reference, tmp_path):
    out = tmp_path / "cap.nc"
    parts = tmp_path / "cap.nc.parts"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
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
    resumed = run_tiny_capture(model_dir, out)
    assert not parts.exists()
    _assert_same_capture(open_capture(out), reference)
    _assert_same_capture(resumed, reference)


def test_resume_reuses_every_part_including_documents_without_samples(model_dir, tmp_path, monkeypatch):
    import qkplast.capture.driver as capture_module

    args = {"samples_per_bucket": 0.1}  # most 64-token documents get no sample at all
    expected = run_tiny_capture(model_dir, tmp_path / "ref.nc", **args)
    assert expected.attrs["n_docs"] == 12 and 0 < len(set(expected["doc"].values)) < 12
    out, parts = tmp_path / "cap.nc", tmp_path / "cap.nc.parts"

    def disk_full(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(capture_module, "save_capture", disk_full)
    with pytest.raises(OSError, match="disk full"):
        run_tiny_capture(model_dir, out, **args)
    assert not out.exists() and len(list(parts.glob("doc-*.nc"))) == 12
    monkeypatch.undo()

    def no_forward(*args, **kwargs):
        raise AssertionError("every document is already in the parts; nothing should be recomputed")

    monkeypatch.setattr(capture_module.Capturer, "capture_window", no_forward)
    _assert_same_capture(run_tiny_capture(model_dir, out, **args), expected)
    assert not parts.exists()


def test_the_last_document_goes_straight_into_the_capture_file(model_dir, tmp_path, monkeypatch, reference):
    """Its part would be deleted right after being written: on success only the other documents get one."""
    from qkplast.capture.resume import PartStore

    written = []
    save = PartStore.save
    monkeypatch.setattr(PartStore, "save", lambda self, index, piece: (written.append(index), save(self, index, piece)))
    _assert_same_capture(run_tiny_capture(model_dir, tmp_path / "cap.nc"), reference)
    assert written == list(range(TINY_CAPTURE["docs"] - 1))


def test_parts_from_other_arguments_are_refused(model_dir, tmp_path):
    out = tmp_path / "cap.nc"
    parts = tmp_path / "cap.nc.parts"
    parts.mkdir()
    (parts / "manifest.json").write_text('{"seed": 1}')
    with pytest.raises(CaptureError, match="different arguments.*seed"):
        run_tiny_capture(model_dir, out)
    assert (parts / "manifest.json").exists() and not out.exists()
    run_tiny_capture(model_dir, out, overwrite=True)
    assert out.exists() and not parts.exists()


def test_existing_output_is_kept_without_overwrite(model_dir, tmp_path):
    out = tmp_path / "cap.nc"
    out.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="--overwrite"):
        run_tiny_capture(model_dir, out)
    assert out.read_bytes() == b"precious"
    run_tiny_capture(model_dir, out, overwrite=True)
    assert open_capture(out).attrs["n_docs"] == 12


def test_unsupported_architecture(tmp_path):
    config = T.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=300, n_positions=128)
    T.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    tiny_tokenizer().save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UnsupportedModelError, match=r"'gpt2'.*supported: Llama 3\.x.*Llama 3\.2 Vision"):
        run_tiny_capture(tmp_path / "gpt2", tmp_path / "cap.nc")
    assert files_written(tmp_path) == []


def test_cli_capture_gives_the_same_capture(model_dir, reference, tmp_path, capsys):
    from qkplast.pipeline.cli import main

    out = tmp_path / "cli.nc"
    argv = ["capture", "--model", str(model_dir), "--corpus", "pydoc-topics", "--short-docs", "concat", "--out", str(out)]
    argv += ["--seq-len", "64", "--bucket-size", "16", "--samples-per-bucket", "2", "--heads", "5", "--docs", "12"]
    assert main(argv + ["--no-progress"]) == 0
    assert "captured 5 heads" in capsys.readouterr().out
    _assert_same_capture(open_capture(out), reference)
    assert main(argv + ["--no-progress"]) == 2
    assert "exists; pass overwrite=True (CLI: --overwrite)" in capsys.readouterr().err


def test_non_finite_vector_stops_the_run_naming_it_and_keeps_finished_documents(model_dir, tmp_path):
    from qkplast.capture.hooks import attention_transform
    from qkplast.capture.models import load_model, release_model
    from qkplast.capture.recorder import NonFiniteCaptureError

    loaded = load_model(str(model_dir))
    calls = {"layer 1": 0}

    def poison_second_window(module, query, key, value, mask, kwargs):
        if module.layer_idx == 1 and query.shape[2] == 64:
            calls["layer 1"] += 1
            if calls["layer 1"] == 2:  # the second document's forward
                query = query.clone()
                query[:, 2] = float("inf")  # q_head 2 of layer 1, every position
        return query, key, value, mask

    out = tmp_path / "cap.nc"
    options = CaptureOptions(**{**TINY_CAPTURE, "model": str(model_dir), "heads": None})
    with attention_transform(loaded.model, poison_second_window):
        with pytest.raises(NonFiniteCaptureError, match=r"document '[^']+', layer 1, q_head\(s\) \[2\]"):
            run_capture(options, out, progress=False, loaded=loaded)
    parts = sorted(p.name for p in (tmp_path / "cap.nc.parts").glob("doc-*.nc"))
    assert parts == ["doc-000000.nc"] and not out.exists()
    # Without the fault, the rerun resumes after the kept document and completes.
    ds = run_capture(options, out, progress=False, loaded=loaded)
    assert ds.attrs["n_docs"] == 12 and open_capture(out).attrs["n_heads"] == 12
    release_model(loaded)
    assert loaded.model is None and loaded.tokenizer is None


def test_loaded_model_must_match_the_options(model_dir, tmp_path):
    from qkplast.capture.models import load_model

    loaded = load_model(str(model_dir))
    options = CaptureOptions(**{**TINY_CAPTURE, "model": "other/model"})
    with pytest.raises(CaptureError, match="the loaded model is"):
        run_capture(options, tmp_path / "cap.nc", progress=False, loaded=loaded)

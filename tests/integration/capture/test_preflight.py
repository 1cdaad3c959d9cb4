"""One preflight per capture: `qkplast run --stage capture` on a tiny local Llama loads the tokenizer once and
cuts each corpus once before the weights load, and the capture reads the windows its preflight cut."""

from collections import Counter

import pytest

from tests.helpers import one_line_error

#: ``qkplast run`` flags of a two-window capture of the tiny model (64-token windows of pydoc-topics).
TINY_RUN = ["--corpus", "pydoc-topics", "--docs", "2", "--seq-len", "64", "--bucket-size", "16",
            "--samples-per-bucket", "2", "--heads", "5", "--short-docs", "concat", "--device", "cpu", "--no-progress"]


@pytest.fixture
def counted(monkeypatch):
    """Count tokenizer loads, model loads, output checks and passes over each corpus (by its spec), in order."""
    import qkplast.capture.corpus as corpus
    import qkplast.capture.driver as driver
    import qkplast.capture.models as models

    calls = []

    def counting(module, name, label):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls.append(label(*args))
            return original(*args, **kwargs)

        return wrapper

    windows = counting(corpus, "iter_windows", lambda documents, *_: ("pass", getattr(documents, "spec", "?")))
    monkeypatch.setattr(corpus, "iter_windows", windows)
    monkeypatch.setattr(driver, "iter_windows", windows)  # imported by name: the capture's own pass
    monkeypatch.setattr(models, "load_tokenizer_with_info", counting(models, "load_tokenizer_with_info",
                                                                     lambda *_: ("tokenizer",)))
    monkeypatch.setattr(models, "load_model", counting(models, "load_model", lambda *_: ("weights",)))
    monkeypatch.setattr(driver, "check_output", counting(driver, "check_output", lambda *_: ("output",)))
    return calls


def test_one_tokenizer_load_and_one_pass_per_corpus_before_the_weights(model_dir, tmp_path, counted):
    from qkplast.capture_format import open_capture
    from qkplast.pipeline.cli import main

    assert main(["run", "--stage", "capture", "--out", str(tmp_path / "run"), "--model", str(model_dir), *TINY_RUN]) == 0
    before = counted[:counted.index(("weights",))]
    after = counted[counted.index(("weights",)) + 1:]
    tally = Counter(counted)
    # the run's preflight loads the tokenizer (with its provenance); the code capture's sizing and preflight and
    # the model load share it: one load in the whole run
    assert tally[("tokenizer",)] == 1 and before.count(("tokenizer",)) == 1, counted
    # each corpus is cut into windows once, by its preflight (the code capture's sizing reads the documents' token
    # lengths, tokenizing them once, not a pass of windows); the captures read the windows their preflights kept
    # (no pass once the weights are loaded)
    assert tally[("pass", "pydoc-topics")] == 1 and tally[("pass", "stdlib-code")] == 1, counted
    assert not [c for c in after if c[0] in ("pass", "tokenizer")], after  # the model load reads only weights
    assert tally[("output",)] == 2  # each capture's output checked once
    capture = open_capture(tmp_path / "run" / "capture.nc")
    assert capture.attrs["n_docs"] == 2 and capture.attrs["window_stats"]["windows"] == 2


@pytest.mark.parametrize("flags, needles", [
    (["--seq-len", "512", "--bucket-size", "32"], ("seq_len 512 exceeds the model's maximum of 256 positions",)),
    (["--docs", "100000"], ("yields", "100000 were asked for")),
    (["--device", "cuda:7"], ("cuda:7",)),
])
def test_bad_input_fails_in_one_line_before_any_weight_loads(model_dir, tmp_path, counted, capsys, flags, needles):
    out = tmp_path / "run"
    one_line_error(capsys, ["run", "--stage", "capture", "--out", str(out), "--model", str(model_dir), *TINY_RUN,
                            *flags], *needles)
    assert ("weights",) not in counted and not (out / "capture.nc").exists()


def test_run_capture_refuses_a_plan_of_other_options(model_dir, tmp_path):
    from dataclasses import replace

    from qkplast.capture.driver import run_capture
    from qkplast.capture.plan import preflight, plan_capture
    from qkplast.capture_format import CaptureError
    from qkplast.options import CaptureOptions

    options = CaptureOptions(model=str(model_dir), corpus="pydoc-topics", docs=2, seq_len=64, bucket_size=16,
                             samples_per_bucket=2, heads=5, short_docs="concat", device="cpu")
    plan = preflight(options)
    assert len(plan.kept_windows) == plan.windows == 2 and plan.tokenizer is not None
    with pytest.raises(CaptureError, match="made for other options"):
        run_capture(replace(options, docs=3), tmp_path / "c.nc", progress=False, plan=plan)
    with pytest.raises(CaptureError, match="not a capture's preflight"):  # a dry-run plan keeps no windows
        run_capture(options, tmp_path / "c.nc", progress=False, plan=plan_capture(options))
    assert not (tmp_path / "c.nc").exists()

"""Content-decay conditions on the embedded SmolLM2-135M: a window equal to the run's is cut from its capture, the
baseline from the capture at every position."""

from dataclasses import replace

import numpy as np


def test_a_window_equal_to_the_runs_is_cut_from_its_capture_exactly(tmp_path):
    """The cut is what a new capture of that condition holds, bit for bit; a capture of other settings is not used."""
    from qkplast.capture.driver import run_capture
    from qkplast.experiments.condition_captures import capture_conditions
    from qkplast.options import CaptureOptions

    opt = CaptureOptions(model="smollm2-135m", corpus="pydoc-topics", docs=2, samples_per_bucket=2, seed=3, seq_len=512,
                         bucket_size=32, heads=None, short_docs="skip")
    run = run_capture(opt, tmp_path / "run.nc", progress=False)
    # the first two documents of pydoc-topics with 512 tokens are those with 512 + 16 (the conditions' margin)
    kw = dict(docs=2, samples_per_bucket=2, seq_len=256, window_lengths=(256, 512), rope_factors=(), sinks=(), heads=6)
    fresh, fresh_s = capture_conditions(tmp_path / "a", opt, **kw)
    cut, cut_s = capture_conditions(tmp_path / "b", opt, **kw, reuse=run)
    assert cut["window_512"].attrs.get("cut_from") and cut_s["window_512"] == 0.0 and fresh_s["window_512"] > 0
    for name in ("q", "k", "position", "doc", "token", "layer", "q_head"):
        np.testing.assert_array_equal(cut["window_512"][name].values, fresh["window_512"][name].values, err_msg=name)
    # the baseline is cut from the capture at every position: what a capture of its own holds, bit for bit
    assert cut["baseline"].attrs["cut_from"] == "all_positions" and cut_s["baseline"] == 0.0
    own, own_s = capture_conditions(tmp_path / "d", opt, **kw, baseline_from_all_positions=False)
    assert not own["baseline"].attrs.get("cut_from") and own_s["baseline"] > 0
    for name in ("q", "k", "position", "doc", "token", "layer", "q_head", "bucket"):
        np.testing.assert_array_equal(cut["baseline"][name].values, own["baseline"][name].values, err_msg=name)
    assert cut["baseline"].attrs["samples_per_bucket"] == own["baseline"].attrs["samples_per_bucket"] == 2
    other, other_s = capture_conditions(tmp_path / "c", replace(opt, seed=4), **kw, reuse=run)  # another seed: captured
    assert not other["window_512"].attrs.get("cut_from") and other_s["window_512"] > 0

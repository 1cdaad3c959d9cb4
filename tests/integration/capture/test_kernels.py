"""The kernel guard inside a capture: eager attention beyond the limit is refused before any long forward."""

from __future__ import annotations

import pytest

from qkplast.capture.kernel_guard import QUADRATIC_LIMIT, KernelError


def test_capture_refuses_eager_beyond_the_limit_before_any_long_forward(tmp_path):
    from tests.hub_fixtures import tiny_model, tiny_tokenizer
    from qkplast.capture.driver import capture
    from qkplast.capture.corpus import Document
    from qkplast.options import CaptureOptions
    from qkplast.capture.recorder import Capturer

    def no_forward(*args, **kwargs):
        raise AssertionError("the guard must refuse before any window is run")

    Capturer.capture_window, saved = no_forward, Capturer.capture_window
    try:
        options = CaptureOptions(seq_len=QUADRATIC_LIMIT * 2, bucket_size=2048, attn="eager", docs=1)
        with pytest.raises(KernelError, match="--attn sdpa"):
            capture(tiny_model("llama3"), tiny_tokenizer(), [Document("d", "x " * 10)], tmp_path / "c.nc", options,
                    progress=False)
    finally:
        Capturer.capture_window = saved
    assert not any(tmp_path.iterdir())  # neither the capture nor its parts directory

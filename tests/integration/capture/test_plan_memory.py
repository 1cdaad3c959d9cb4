"""Issue 23, the thesis-scale path without a GPU: the code capture sized to its corpus, the memory plan
(refusal, float32 upcasts, LM-head chunks, several GPUs), studies validated before submission (SLURM keys and
dry run, pinned and floating revisions, the commit a requeued job checks), local jobs one GPU each, progress
lines, and the GPU cache emptied before the notebooks."""

from __future__ import annotations


import pytest

from qkplast.capture.plan import (activation_bytes_per_token)
from tests.helpers import ROOT



# --------------------------------------------------------------------------- 1. the code capture


# --------------------------------------------------------------------------- 7. memory


# --------------------------------------------------------------------------- 5, 6, 9. studies


# --------------------------------------------------------------------------- 4. local jobs on a GPU host


# --------------------------------------------------------------------------- 6. progress lines, 12. GPU cache


@pytest.mark.parametrize("arch, dtype", [("qwen3", "float32"), ("smollm3", "float32"), ("mllama", "float32"),
                                         ("qwen3", "bfloat16")])
def test_the_plan_is_within_15_percent_of_the_measured_peak_on_the_rehearsal_models(arch, dtype, tmp_path):
    """The peak-RSS slope of a bare forward between 8192 and 32768 tokens (each length in a fresh process, as
    ``benchmarks/bench_scale.py --kappa`` measures it) against the plan's activation bytes per token."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_scale

    from tests.hub_fixtures import tiny_config

    measured = bench_scale.measure_slope(arch, (8192, 32768), dtype)
    planned = activation_bytes_per_token(tiny_config(arch), dtype, "cpu")
    assert 0.85 <= measured / planned <= 1.15, (arch, dtype, measured, planned)

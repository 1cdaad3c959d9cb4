"""The one-command GPU check (benchmarks/bench_gpu.py) on this machine: what it carries to the GPU, its wall-time
estimate, and its CPU rehearsal of the README's thesis-scale command through every stage."""

from __future__ import annotations

import sys

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_gpu  # noqa: E402


def test_the_wheels_carried_are_what_the_gpu_image_lacks():
    missing = bench_gpu.missing_packages()
    assert {"h5netcdf", "submitit", "papermill", "nbclient", "nbformat", "ipykernel", "jupytext"} <= set(missing)
    assert not {"torch", "transformers", "numpy", "xarray", "h5py", "scipy", "pandas"} & set(missing)
    assert not bench_gpu.NOT_FOR_THE_CHECK & set(missing)  # the book's toolchain stays home
    assert bench_gpu.PIP_PLATFORMS[0] == "manylinux_2_28_x86_64" and "manylinux1_x86_64" in bench_gpu.PIP_PLATFORMS


def test_the_wall_time_estimate_scales_the_measured_window_by_flops():
    lines = bench_gpu.estimate_wall_time()
    assert lines[0].startswith("measured: qwen3-8b 13.5 s/window")
    rows = {line.split(":")[0]: line for line in lines[1:]}
    assert set(rows) == {"qwen3-8b", "llama-3.1-8b", "ministral-3-14b"}
    assert "13.5 s/window, 500 windows 1.88 h" in rows["qwen3-8b"]  # 500 x 13.5 s
    flops = {name: bench_gpu.window_flops(name) for name in rows}
    assert flops["ministral-3-14b"] > flops["qwen3-8b"] > flops["llama-3.1-8b"]



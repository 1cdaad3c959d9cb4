"""The one-command GPU check (benchmarks/bench_gpu.py) on this machine: what it carries to the GPU, its wall-time
estimate, and its CPU rehearsal of the README's thesis-scale command through every stage."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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


@pytest.mark.acceptance
def test_the_cpu_rehearsal_runs_the_readme_command_through_every_stage(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--selftest-cpu", "--work",
                        str(tmp_path), "--budget-s", "3600"], env=env, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert "exit status 0" in out and "notebooks: 13 executed" in out
    ratio = float(re.search(r"capture / bare = ([0-9.]+)", out).group(1))
    assert 0.5 < ratio < 3  # the capture costs about a bare forward (hooks copy only the sampled rows)
    assert re.search(r"seconds per window \(main capture, 2 windows of 16384 tokens\): [0-9.]+", out)
    assert re.search(r"analyze of the run on the CPU: [0-9.]+ s", out) and "budget:" in out
    print(out[out.index("seconds per window"):])

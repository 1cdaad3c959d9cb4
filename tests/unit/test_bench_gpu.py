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




def test_after_a_failed_notebook_the_check_runs_each_one_not_reached_and_reports_all(tmp_path, monkeypatch):
    import json

    from qkplast.errors import QkplastError
    from qkplast.pipeline import params, stages

    paths = [tmp_path / f"0{i}_x.ipynb" for i in range(1, 5)]
    ran = []

    def stage(out, manifest, parameters, todo, progress=True):
        assert len(todo) == 1 and manifest["notebooks"] == [] and parameters == {"n_boot": 7}  # each one alone
        ran.append(todo[0].name)
        ok = todo[0].name != "03_x.ipynb"
        manifest["notebooks"] = [{"name": todo[0].name, "status": "ok" if ok else "failed", "seconds": 1.0,
                                  "cell": None if ok else 4, "error": None if ok else "ValueError: planted"}]
        if not ok:
            raise QkplastError("notebook 03_x.ipynb failed")

    monkeypatch.setattr(params, "notebook_paths", lambda: paths)
    monkeypatch.setattr(stages, "notebook_stage", stage)
    (tmp_path / "manifest.json").write_text(json.dumps({"notebooks": [
        {"name": "01_x.ipynb", "status": "ok", "seconds": 2.0},
        {"name": "02_x.ipynb", "status": "failed", "cell": 3, "error": "KeyError: 'x'"}]}))
    entries = bench_gpu.notebooks_left(tmp_path, {"n_boot": 7})
    assert ran == ["03_x.ipynb", "04_x.ipynb"]  # what the run reached is not executed again
    assert [(e["name"], e["status"]) for e in entries] == [
        ("01_x.ipynb", "ok"), ("02_x.ipynb", "failed"), ("03_x.ipynb", "failed"), ("04_x.ipynb", "ok")]
    recorded = json.loads((tmp_path / "manifest.json").read_text())["notebooks"]
    assert [e["name"] for e in recorded] == [e["name"] for e in entries]  # the run's manifest keeps them all


def test_the_failure_trace_is_the_error_output_of_the_executed_copy_without_colours(tmp_path):
    import json

    cells = [{"cell_type": "code", "outputs": [{"output_type": "stream", "text": "fine"}]},
             {"cell_type": "code", "outputs": [{"output_type": "error", "traceback": [
                 "\x1b[0;31mValueError\x1b[0m Traceback", "line a", "\x1b[0;31mValueError\x1b[0m: planted"]}]}]
    executed = tmp_path / "nb.ipynb"
    executed.write_text(json.dumps({"cells": cells}))
    assert bench_gpu.failure_trace(executed) == "ValueError Traceback\nline a\nValueError: planted"
    assert bench_gpu.failure_trace(executed, lines=1) == "ValueError: planted"
    assert bench_gpu.failure_trace(tmp_path / "absent.ipynb") == "(no executed copy)"

"""Batches that execute notebooks (Jupyter kernels) on a planted capture: a failing notebook fails the run naming
its cell, and notebooks run at once with jobs while the manifest keeps their order."""

import json

import nbformat
import pytest

from qkplast import rundir
from qkplast.pipeline import stages
from tests.helpers import fake_stage


def test_failing_notebook_fails_the_run_with_cell_and_error(tmp_path, monkeypatch):
    bad = tmp_path / "nb"
    bad.mkdir()
    nb = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}}
    )
    nb.cells = [
        nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("raise ValueError('planted failure')"),
    ]
    nbformat.write(nb, bad / "01_bad.ipynb")
    fake_stage(monkeypatch, tmp_path)
    from qkplast import CaptureOptions

    tiny = CaptureOptions(seq_len=512, bucket_size=64, docs=2)
    # cell 3 of the executed copy: papermill inserts the injected-parameters cell after the parameters cell
    with pytest.raises(rundir.RunError, match=r"01_bad.ipynb failed in cell 3: ValueError: planted failure"):
        stages.run(tiny, tmp_path / "run", notebooks=[bad / "01_bad.ipynb"], progress=False)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["notebooks"][0]["error"].startswith("ValueError")


def _sleepy_notebook(folder, name, body):
    nb = nbformat.v4.new_notebook(
        metadata={"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}}
    )
    nb.cells = [nbformat.v4.new_code_cell("run_dir = ''", metadata={"tags": ["parameters"]}),
                nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, folder / name)
    return folder / name


def test_notebooks_run_at_once_with_jobs_and_the_manifest_keeps_their_order(tmp_path, monkeypatch):
    """jobs=2: two kernels at once (their start/end times overlap), entries in notebook order; a failure among them
    fails the run, records the failing cell and keeps the entries of those that finished."""
    folder = tmp_path / "nb"
    folder.mkdir()
    body = ("import time, json, pathlib\nt0 = time.time()\ntime.sleep(3)\n"
            "pathlib.Path(run_dir, '{name}.json').write_text(json.dumps([t0, time.time()]))")
    paths = [_sleepy_notebook(folder, f"0{i}_sleep.ipynb", body.format(name=i)) for i in (1, 2)]
    fake_stage(monkeypatch, tmp_path)
    from qkplast import CaptureOptions

    tiny = CaptureOptions(seq_len=512, bucket_size=64, docs=2)
    # a relative run directory: papermill moves the working directory while a notebook runs, and the manifest
    # is written meanwhile
    monkeypatch.chdir(tmp_path)
    result = stages.run(tiny, "run", notebooks=[p.relative_to(tmp_path) for p in paths], progress=False, jobs=2)
    spans = [json.loads((tmp_path / "run" / f"{i}.json").read_text()) for i in (1, 2)]
    assert max(s[0] for s in spans) < min(s[1] for s in spans)  # both kernels were inside their sleep at once
    assert [e["name"] for e in result.manifest["notebooks"]] == ["01_sleep.ipynb", "02_sleep.ipynb"]
    assert all(e["status"] == "ok" for e in result.manifest["notebooks"])
    assert list((tmp_path / "run").glob("bootstrap*.nc"))  # made once before the notebooks, not by each of them
    bad = _sleepy_notebook(folder, "03_bad.ipynb", "raise ValueError('planted failure')")
    with pytest.raises(rundir.RunError, match=r"03_bad.ipynb failed in cell 3: ValueError: planted failure"):
        stages.run(tiny, tmp_path / "run", notebooks=[*paths, bad], progress=False, jobs=2)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert [(e["name"], e["status"]) for e in manifest["notebooks"]] == [
        ("01_sleep.ipynb", "ok"), ("02_sleep.ipynb", "ok"), ("03_bad.ipynb", "failed")]


def test_each_kernel_starts_in_its_notebook_folder_while_the_process_directory_moves(tmp_path, monkeypatch):
    """jobs=2 with another thread moving the process's working directory the whole time (what papermill's ``cwd=``
    and its autosaves do from the other notebook's thread): every kernel still starts in its notebook's folder,
    so a parameter relative to it (chapter 10's ``full_run`` before it was resolved by the package) reads the
    same files. With papermill's ``cwd=``, 2 kernels of 15 started in the process's first directory beside a
    notebook that autosaved after each of its 400 cells (the book's chapter 10 then trained the preview)."""
    import os
    import threading

    folder, elsewhere = tmp_path / "nb", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    body = "import os, pathlib\npathlib.Path(run_dir, '{name}.cwd').write_text(os.getcwd())"
    paths = [_sleepy_notebook(folder, f"0{i}_cwd.ipynb", body.format(name=i)) for i in range(1, 5)]
    fake_stage(monkeypatch, tmp_path)
    from qkplast import CaptureOptions

    stop = threading.Event()

    def move():  # the process's directory flips between two folders, neither the notebooks'
        while not stop.is_set():
            for where in (elsewhere, tmp_path):
                os.chdir(where)
                stop.wait(0.0005)

    monkeypatch.chdir(tmp_path)
    mover = threading.Thread(target=move, daemon=True)
    mover.start()
    try:
        stages.run(CaptureOptions(seq_len=512, bucket_size=64, docs=2), tmp_path / "run", notebooks=paths,
                   progress=False, jobs=2)
    finally:
        stop.set()
        mover.join()
    started = {i: (tmp_path / "run" / f"{i}.cwd").read_text() for i in range(1, 5)}
    assert started == {i: str(folder) for i in range(1, 5)}


def test_a_study_job_to_the_notebooks_stage_executes_them_with_the_studys_parameters(tmp_path, monkeypatch):
    """The job a study submits (``RunJob``, what submitit runs on SLURM or locally) through the notebooks stage: the
    run's notebooks executed with the study's notebook parameters, the run recorded done at that stage. (The SLURM
    and local-executor tests stop at the analyze stage; the notebooks on a study's run are this call.)"""
    from qkplast.pipeline.study import RunJob
    from qkplast.rundir.study_file import is_done, load_study
    from tests.helpers import write_yaml

    folder = tmp_path / "nb"
    folder.mkdir()
    paths = [_sleepy_notebook(folder, f"0{i}_study.ipynb", "import pathlib\nstudy = globals().get('study')\n"
                              f"pathlib.Path(run_dir, '{i}.study').write_text(str(study))") for i in (1, 2)]
    for path in paths:  # the notebooks declare the study parameter, as the book's results chapters do
        nb = nbformat.read(path, 4)
        nb.cells[0].source = "run_dir = ''\nstudy = ''"
        nbformat.write(nb, path)
    fake_stage(monkeypatch, tmp_path)
    monkeypatch.setattr(stages, "notebook_paths", lambda: paths)
    study = load_study(write_yaml(tmp_path / "s.yaml", {
        "name": "nb", "out": str(tmp_path / "out"), "parameters": {"study": "the study's value"},
        "allow_floating": True,
        "defaults": {"seq_len": 512, "bucket_size": 64, "docs": 2},
        "models": [{"id": "planted/model", "name": "r"}]}))
    spec = study.runs[0]
    assert RunJob(spec, "notebooks", parameters=study.parameters)() == "done"
    assert is_done(spec.run_dir, "notebooks")
    assert [(spec.run_dir / f"{i}.study").read_text() for i in (1, 2)] == ["the study's value"] * 2

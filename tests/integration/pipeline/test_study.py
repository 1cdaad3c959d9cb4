"""Studies: a live run is not submitted twice and a dead one is failed (a child process supplies a dead pid)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from qkplast.pipeline.study import status
from qkplast.rundir.study_file import load_study
from tests.helpers import cli, write_yaml


def test_a_live_run_is_not_submitted_twice_and_a_dead_one_is_failed(tmp_path, capsys):
    from qkplast.pipeline.study import submit
    from qkplast.rundir.study_file import STATE

    path = write_yaml(tmp_path / "s.yaml", {"name": "s", "allow_floating": True, "out": str(tmp_path / "o"), "models": [{"id": "a/b"}]})
    study = load_study(path)
    run = study.runs[0].run_dir
    run.mkdir(parents=True)
    (run / STATE).write_text(json.dumps({"state": "running", "pid": os.getpid(), "host": os.uname().nodename}))
    lines = []
    assert submit(study, "local", "capture", echo=lines.append) == {}
    assert lines == ["a-b: running (job None), not submitted"]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run / STATE).write_text(json.dumps({"state": "running", "pid": int(dead.stdout), "host": os.uname().nodename}))
    row = status(study)[0]
    assert row["state"] == "failed" and "run the study again to resume it" in row["reason"]
    code, out, _ = cli(capsys, "study", str(path), "--status")
    assert code == 0 and out.startswith("a-b: failed: the job ended without finishing")

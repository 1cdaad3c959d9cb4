"""Command line: the planner's dry run on the embedded model's config and tokenizer, and its refusals."""

import json
import os
import subprocess
import sys

import pytest

from qkplast.pipeline.cli import main
from tests.helpers import ROOT, one_line_error


def test_dry_run_prints_the_plan_and_captures_nothing(tmp_path, capsys):
    """The planner reads config and tokenizer only: windows, heads, expected peak, verdict; no run directory."""
    out = tmp_path / "run"
    assert main(["run", "--dry-run", "--preset", "fast", "--docs", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "windows (yielded / wanted)  3 / 3" in text and "2048 / 128 (16 buckets)" in text
    assert "verdict                     fits" in text and "dry run: nothing captured" in text
    assert not out.exists()


def test_dry_run_refuses_what_does_not_fit(capsys):
    one_line_error(capsys, ["run", "--dry-run", "--preset", "fast", "--device-memory-gb", "0.05"],
                    "exceeds the 0.1 GiB")
    one_line_error(capsys, ["plan", "--preset", "fast", "--corpus", "pydoc-topics", "--docs", "100000"],
                    "yields", "100000")


_STARTUP_CHILD = """
import json, sys
from qkplast.pipeline.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:  # --help
    code = exc.code
heavy = sorted(m for m in ("torch", "xarray", "pandas", "scipy", "transformers", "matplotlib") if m in sys.modules)
print(json.dumps({"code": code, "heavy": heavy}))
"""


@pytest.mark.parametrize("argv, status", [(["--help"], 0), (["run", "--help"], 0), (["study", "STUDY", "--status"], 0),
                                          (["run", "--seq-len", "many"], 2), (["train", "--preset", "none"], 2)],
                         ids=["help", "run-help", "study-status", "bad-flag", "bad-preset"])
def test_commands_that_touch_no_tensor_import_none_of_the_numerical_stack(argv, status, tmp_path):
    """``qkplast --help``, ``qkplast study --status`` and a refused flag answer in a fraction of a second: the
    packages load their numerical modules (torch, xarray, scipy, ...) on first use, not on ``import qkplast``
    (every command imports the CLI module, which once took 3.5 s of imports before printing a line)."""
    study = tmp_path / "study.yaml"
    study.write_text((ROOT / "studies" / "local.yaml").read_text())
    argv = [str(study) if a == "STUDY" else a for a in argv]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _STARTUP_CHILD, *argv], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == status, done.stderr
    assert result["heavy"] == [], f"qkplast {' '.join(argv)} imported {result['heavy']}"

"""The README's Python quickstart runs as written (on a planted capture: no model), and its files come out."""

from __future__ import annotations

import re
import warnings

import numpy as np

import qkplast
from tests.helpers import ROOT


def quickstart() -> str:
    """The python block under the README's "Python quickstart" heading."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Python quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"the README's quickstart has {len(blocks)} python blocks, not one"
    return blocks[0]


def test_the_readme_quickstart_runs_and_writes_its_metrics(tmp_path, monkeypatch, capsys):
    code = quickstart()
    assert len(code.strip().splitlines()) <= 14, "the quickstart is meant to be about ten lines"
    monkeypatch.chdir(tmp_path)
    namespace = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", qkplast.analysis.PlasticityWarning)  # the first bucket has no earlier keys
        exec(compile(code, "README.md (Python quickstart)", "exec"), namespace)
    metrics = qkplast.open_dataset(tmp_path / "metrics.nc")
    # the planted heads lose plasticity with position, as the model they are drawn from says
    assert np.all(metrics["ap_drop"].values > 0.3), metrics["ap_drop"].values
    assert "ap_drop" in capsys.readouterr().out
    intervals = namespace["intervals"]
    drop = intervals.sel(metric="ap_drop")  # the interval over documents that the comment promises, per head
    assert {"estimate", "lo", "hi"} <= set(intervals.data_vars)
    assert np.all(drop["lo"].values <= drop["estimate"].values) and np.all(drop["estimate"].values <= drop["hi"].values)

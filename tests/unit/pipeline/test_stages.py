"""``qkplast run`` (:mod:`qkplast.pipeline.stages`) and the run directory the notebooks read from it.

With the model load and the capture faked (a planted capture, ``tests.helpers.fake_stage``): the corpora are
checked before one model load per run, the model is released before anything else, the manifest records the
settings and a rerun reuses every capture and refuses other settings; ``rundir.load_run`` gives a notebook the
same settings and files (from a notebook's namespace, or from a capture made without a run); the notebooks'
parameters cells hold no capture or analysis settings (``pipeline.params`` types ``-p`` overrides) and load a
model only through ``load_for(run.options)``. Notebooks executed in Jupyter kernels: tests/integration/pipeline.
"""

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from qkplast import rundir
from qkplast.pipeline import params, stages
from tests.helpers import NOTEBOOKS, fake_stage


def parameters_cell(path: Path) -> dict:
    """The literal assignments of a py:percent notebook's cell tagged 'parameters'."""
    text = path.read_text()
    match = re.search(r'# %% tags=\["parameters"\]\n(.*?)(?=\n# %%)', text, re.S)
    assert match, f"{path.name} has no parameters cell"
    values = {}
    for node in ast.parse(match.group(1)).body:
        assert isinstance(node, ast.Assign), f"{path.name}: only plain assignments belong in the parameters cell"
        values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def test_every_notebook_is_paired_and_has_a_first_parameters_cell():
    assert len(NOTEBOOKS) == 13
    for py in NOTEBOOKS:
        nb = nbformat.read(py.with_suffix(".ipynb"), 4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert "parameters" in code[0].metadata.get("tags", []), py.name
        assert "formats: ipynb,py:percent" in py.read_text()
        # the pair is in sync: the .ipynb sources equal the .py cells
        import jupytext

        assert [c.source for c in jupytext.read(py).cells] == [c.source for c in nb.cells], (
            f"{py.name}: run jupytext --sync"
        )


def test_papermill_reads_every_declared_parameter(caplog):
    """papermill parses a parameters cell line by line with its own pattern, which gives up on a line whose comment
    holds an ``=`` (``# (>= 1000 ...)``): it then logs "Unable to parse line" on every run and "Passed unknown
    parameter" whenever ``-p`` sets that name, although the value is still injected. Every name qkplast declares is
    one papermill reads too, and no line is left unparsed."""
    import logging

    from papermill.translators import PythonTranslator

    for py in NOTEBOOKS:
        cell = next(c for c in nbformat.read(py.with_suffix(".ipynb"), 4).cells
                    if "parameters" in c.metadata.get("tags", []))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="papermill"):
            read = {p.name for p in PythonTranslator.inspect(cell)}
        assert read == set(params.declared_parameters(py.with_suffix(".ipynb"))), py.name
        assert "Unable to parse" not in caplog.text, f"{py.name}: {caplog.text.strip()} (no '=' in its comment)"


def test_notebook_parameters_hold_no_capture_or_analysis_settings():
    """The settings live in the run's manifest: a parameters cell holds run_dir and the page's own values."""
    from dataclasses import fields

    from qkplast import AnalysisOptions, CaptureOptions

    settings = {f.name for f in fields(CaptureOptions)} | {f.name for f in fields(AnalysisOptions)} | {"analysis"}
    for py in NOTEBOOKS:
        params = parameters_cell(py)
        assert params["run_dir"] == "../runs/smollm2-135m", py.name
        assert not settings & set(params), f"{py.name} repeats settings {sorted(settings & set(params))}"
        if "load_or_capture(" in py.read_text():
            pytest.fail(f"{py.name} still captures with its own settings; use rundir.load_run")


def test_run_loads_once_captures_prose_and_code_releases_then_reuses(tmp_path, monkeypatch):
    from dataclasses import fields

    from qkplast import AnalysisOptions, CaptureOptions

    calls = fake_stage(monkeypatch, tmp_path)
    capture = CaptureOptions(seq_len=1024, bucket_size=128, docs=3, corpus="pydoc-topics")
    out = tmp_path / "run"
    result = stages.run(capture, out, analysis=AnalysisOptions(n_pairs=16), stage="analyze", progress=False)
    # corpora checked before the single load; both captures; the model released before anything else
    assert calls == [("windows", "pydoc-topics"), ("windows", "stdlib-code"), ("load", "smollm2-135m"),
                     ("capture", "pydoc-topics"), ("capture", "stdlib-code"), ("release", "model")]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["stage"] == "analyze" and manifest["commit"] == "0123abc"
    assert list(manifest["capture"]) == [f.name for f in fields(CaptureOptions)] == list(capture.to_dict())
    assert manifest["capture"] == capture.to_dict() and manifest["analysis"]["n_pairs"] == 16
    assert {"capture", "analyze"} <= set(manifest["timings_s"]) and result.manifest == manifest
    for d in (out, out / "code"):
        assert (d / "capture.nc").is_file() and (d / "metrics.nc").is_file()
    # a notebook finds the same settings and files, and loads nothing
    loaded = rundir.load_run(out)
    assert loaded.options == capture and loaded.analysis.n_pairs == 16 and loaded.metrics.sizes["head"] == 2
    assert rundir.load_run(out).on_corpus("stdlib-code").capture.attrs["corpus"] == "stdlib-code"
    # a rerun reuses every capture (no load); other capture settings are refused, not mixed
    del calls[:]
    stages.run(capture, out, analysis=AnalysisOptions(n_pairs=16), stage="analyze", progress=False)
    assert calls == []
    with pytest.raises(rundir.RunError, match="docs: 3 there, 4 asked"):
        stages.run(CaptureOptions(**{**capture.to_dict(), "docs": 4}), out, stage="capture", progress=False)
    with pytest.raises(rundir.RunError, match="docs: 3 there, 5 asked"):
        rundir.load_run(out, docs=5)
    with pytest.raises(rundir.RunError, match="analysed with other options"):
        stages.run(capture, out, analysis=AnalysisOptions(n_pairs=32), stage="analyze", progress=False)


def test_load_run_reads_overrides_from_a_notebook_namespace(tmp_path, monkeypatch):
    calls = fake_stage(monkeypatch, tmp_path)
    import qkplast.capture.driver as driver

    monkeypatch.setattr(driver, "run_capture", lambda *a, loaded=None, **k: calls.append("in-kernel") or
                        _fake_capture_in_kernel(*a, **k))
    run = rundir.load_run(tmp_path / "new", {"seq_len": 512, "bucket_size": 64, "docs": 2, "n_pairs": 8,
                                            "unrelated": 1, "__name__": "__main__"})
    assert run.options.seq_len == 512 and run.analysis.n_pairs == 8 and calls == ["in-kernel"]
    # the next notebook, without overrides, finds the settings the first one recorded
    again = rundir.load_run(tmp_path / "new")
    assert again.options == run.options and calls == ["in-kernel"]
    with pytest.raises(TypeError, match="unknown option"):
        rundir.load_run(tmp_path / "new", sequence_length=5)


def _fake_capture_in_kernel(options, out, **_):
    from qkplast.capture_format import save_capture
    from qkplast.theory.planted import planted_capture

    cap, _ = planted_capture(n_heads=2, dim=8, seq_len=options.seq_len, bucket_size=options.bucket_size,
                             n_docs=options.docs, samples_per_bucket=2)
    save_capture(cap, out)
    return cap


def test_split_parameters_types_each_kind():
    cap, ana, nb = params.split_parameters(
        [("seq_len", "4096"), ("rope_scaling", "yarn:4:32768"), ("heads", "all"), ("edge_fraction", "0.25"),
         ("checkpoints", "['a/b@r1']"), ("code_corpus", "stdlib-code")],
        {"checkpoints": [], "code_corpus": "stdlib-code", "n_boot": 40})
    assert cap == {"seq_len": 4096, "rope_scaling": "yarn:4:32768", "heads": None}
    assert ana == {"edge_fraction": 0.25} and nb == {"checkpoints": ["a/b@r1"], "code_corpus": "stdlib-code"}
    with pytest.raises(ValueError, match="checkpoints expects list"):
        params.split_parameters([("checkpoints", "a/b")], {"checkpoints": []})
    # a string parameter: its text as it is, or unquoted when quoted (json.dumps, a YAML study)
    for text in ("smoke", '"smoke"', "'smoke'"):
        assert params.split_parameters([("training", text)], {"training": ""})[2] == {"training": "smoke"}
    assert params.split_parameters([("training", '"')], {"training": ""})[2] == {"training": '"'}


def test_load_run_takes_the_settings_of_a_capture_made_without_a_run(tmp_path, monkeypatch):
    """``qkplast capture --out RUN/capture.nc`` then a notebook: the settings come from the capture's attrs."""
    from qkplast import CaptureOptions
    from qkplast.capture_format import save_capture
    from qkplast.theory.planted import planted_capture

    calls = fake_stage(monkeypatch, tmp_path)
    options = CaptureOptions(seq_len=1024, bucket_size=128, docs=3, corpus="pydoc-topics")
    cap, _ = planted_capture(n_heads=2, dim=8, seq_len=1024, bucket_size=128, n_docs=3, samples_per_bucket=2)
    cap.attrs.update(options.to_dict())
    (tmp_path / "run").mkdir()
    save_capture(cap, tmp_path / "run" / "capture.nc")
    run = rundir.load_run(tmp_path / "run")
    assert run.options == options and calls == []
    with pytest.raises(rundir.RunError, match="seq_len: 1024 there, 2048 asked"):
        rundir.load_run(tmp_path / "run", seq_len=2048, bucket_size=128)


def test_the_notebooks_load_the_model_with_the_recorded_tokenizer(tmp_path, monkeypatch):
    # A checkpoint series without a tokenizer of its own (SmolLM3's) names its base model's: the run records it,
    # and a notebook's model comes from qkplast.capture.models.load_for(run.options) with it (the capture stage's
    # own path, which tests/acceptance rehearses); every notebook that loads a model does so through load_for.
    from qkplast.options import CaptureOptions
    from qkplast.rundir.products import write_manifest

    options = CaptureOptions(model="owner/series@stage1-step-40000", tokenizer="owner/base@main", docs=2)
    write_manifest(tmp_path, {"capture": options.to_dict()})
    recorded, _ = rundir.run_settings(tmp_path)
    assert recorded.tokenizer == "owner/base@main" and recorded == options
    import qkplast.capture.models as models

    seen = []
    monkeypatch.setattr(models, "load_model", lambda *a, **k: seen.append(k.get("tokenizer")))
    models.load_for(recorded)
    assert seen == ["owner/base@main"]
    loads = {p.name for p in NOTEBOOKS if re.search(r"load_model|from_pretrained", p.read_text())}
    assert not loads, f"{sorted(loads)} load a model other than through load_for(run.options)"


def test_notebooks_run_at_once_log_whole_lines(tmp_path, monkeypatch):
    """With ``jobs=2`` two threads log their notebooks' labels at the same moment: each line is one write, so two
    labels never share a line of the log (``print`` writes the text and its newline separately)."""
    import sys
    import threading

    import papermill

    both = threading.Barrier(2, timeout=10)
    monkeypatch.setattr(papermill, "execute_notebook", lambda *args, **kwargs: both.wait())

    class Recorder:
        def __init__(self):
            self.writes = []

        def write(self, text):
            self.writes.append(text)

        def flush(self):
            pass

    err = Recorder()
    monkeypatch.setattr(sys, "stderr", err)
    paths = [NOTEBOOKS[0].with_suffix(".ipynb"), NOTEBOOKS[2].with_suffix(".ipynb")]
    manifest = {"notebooks": [], "timings_s": {}}
    stages.notebook_stage(tmp_path, manifest, {}, paths, jobs=2)
    assert [e["status"] for e in manifest["notebooks"]] == ["ok", "ok"]
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in err.writes), err.writes
    lines = "".join(err.writes).splitlines()
    assert len(lines) == 4 and all(line.startswith("[qkplast run] notebook ") for line in lines), lines

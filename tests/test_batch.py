"""Batches: a papermill run on a tiny configuration produces every artifact; one model load per run,
released before the notebooks; notebooks hold no settings of their own; reuse refuses other settings."""

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from qkplast.pipeline import batch

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
TINY = {"docs": 2, "seq_len": 256, "bucket_size": 32, "samples_per_bucket": 4, "heads": 12}
#: Notebook parameters of the tiny batch: small grids for the two chapters beyond the thesis (nbval runs their
#: defaults, the rehearsal runs them on random-weight models), so the batch tests the plumbing in about a minute.
TINY_NOTEBOOKS = {"n_boot": 4, "n_perm": 20, "ks": [2], "n_null": 2, "window": 128, "positions": [64, 120],
                  "distances": [16, 40], "seg_len": 8, "copy_windows": 2, "geometry_docs": 2, "n_reseeds": 5,
                  "rope_factors": [2.0], "window_factors": [1], "cond_docs": 2}


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


@pytest.mark.acceptance
def test_tiny_papermill_batch_produces_every_artifact(tmp_path):
    from dataclasses import fields

    from qkplast import AnalysisOptions, CaptureOptions
    from qkplast.io import open_capture, open_dataset
    from qkplast.options import PRESETS

    out = tmp_path / "run"
    tiny = CaptureOptions(**{**PRESETS["fast"].to_dict(), **TINY})
    result = batch.run(tiny, out, analysis=AnalysisOptions(n_pairs=32), parameters=TINY_NOTEBOOKS, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest == json.loads(json.dumps(result.manifest, default=str))
    # one set of names: CaptureOptions fields == manifest keys == capture attrs, same values
    attrs = open_capture(out / "capture.nc").attrs
    assert list(manifest["capture"]) == [f.name for f in fields(CaptureOptions)]
    for name, value in manifest["capture"].items():
        assert name in attrs, f"capture attrs lack {name}"
        if name not in ("device", "dtype"):
            assert attrs[name] == value, (name, attrs[name], value)
    assert "commit" in attrs and "revision" in attrs and manifest["commit"] == attrs["commit"]
    assert (out / "metrics.nc").is_file() and (out / "code" / "capture.nc").is_file()
    assert open_dataset(out / "metrics.nc").attrs["options"]["n_pairs"] == 32
    names = sorted(p.name for p in (out / "notebooks").glob("*.ipynb"))
    assert names == sorted(p.with_suffix(".ipynb").name for p in NOTEBOOKS)
    for name in names:
        nb = nbformat.read(out / "notebooks" / name, 4)
        errors = [
            o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"
        ]
        assert not errors, name
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert injected and f'run_dir = "{out.resolve()}"' in injected[0].source
    assert set(manifest["versions"]) >= {"qkplast", "torch", "transformers", "papermill"}
    table = batch.compare([out])
    assert table.loc["run", "seq_len"] == 256 and 0 < table.loc["run", "ap_overall"] < 1
    profiles = batch.context_profiles([out, out])
    assert profiles.dims == ("run", "context_bin") and profiles.sizes["context_bin"] == 5
    # a rerun executes nothing again
    again = batch.run(tiny, out, parameters=TINY_NOTEBOOKS, progress=False)
    assert [e["seconds"] for e in again.manifest["notebooks"]] == [e["seconds"] for e in manifest["notebooks"]]


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
            pytest.fail(f"{py.name} still captures with its own settings; use batch.load_run")


def _fake_stage(monkeypatch, tmp_path):
    """Replace the model load and the capture by a planted capture, recording the calls in order."""
    from qkplast.theory.planted import planted_capture

    calls = []

    def fake_capture(options, out, *, overwrite=False, progress=True, loaded=None):
        assert loaded == "model", "every capture of a run uses the one loaded model"
        calls.append(("capture", options.corpus))
        cap, _ = planted_capture(n_heads=2, dim=8, seq_len=options.seq_len, bucket_size=options.bucket_size,
                                 n_docs=options.docs, samples_per_bucket=2)
        cap.attrs.update(corpus=options.corpus, commit="0123abc")
        from qkplast.io import save_capture

        save_capture(cap, out)
        return cap

    monkeypatch.setattr(batch, "_check_windows", lambda options: calls.append(("windows", options.corpus)))
    monkeypatch.setattr(batch, "_load", lambda options: calls.append(("load", options.model)) or "model")
    monkeypatch.setattr(batch, "release_model", lambda loaded: calls.append(("release", loaded)))
    monkeypatch.setattr(batch, "capture_file", fake_capture)
    return calls


def test_run_loads_once_captures_prose_and_code_releases_then_reuses(tmp_path, monkeypatch):
    from dataclasses import fields

    from qkplast import AnalysisOptions, CaptureOptions

    calls = _fake_stage(monkeypatch, tmp_path)
    capture = CaptureOptions(seq_len=1024, bucket_size=128, docs=3, corpus="pydoc-topics")
    out = tmp_path / "run"
    result = batch.run(capture, out, analysis=AnalysisOptions(n_pairs=16), stage="analyze", progress=False)
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
    loaded = batch.load_run(out)
    assert loaded.options == capture and loaded.analysis.n_pairs == 16 and loaded.metrics.sizes["head"] == 2
    assert batch.load_run(out).on_corpus("stdlib-code").capture.attrs["corpus"] == "stdlib-code"
    # a rerun reuses every capture (no load); other capture settings are refused, not mixed
    del calls[:]
    batch.run(capture, out, analysis=AnalysisOptions(n_pairs=16), stage="analyze", progress=False)
    assert calls == []
    with pytest.raises(batch.RunError, match="docs: 3 there, 4 asked"):
        batch.run(CaptureOptions(**{**capture.to_dict(), "docs": 4}), out, stage="capture", progress=False)
    with pytest.raises(batch.RunError, match="docs: 3 there, 5 asked"):
        batch.load_run(out, docs=5)
    with pytest.raises(batch.RunError, match="analysed with other options"):
        batch.run(capture, out, analysis=AnalysisOptions(n_pairs=32), stage="analyze", progress=False)


def test_load_run_reads_overrides_from_a_notebook_namespace(tmp_path, monkeypatch):
    calls = _fake_stage(monkeypatch, tmp_path)
    monkeypatch.setattr(batch, "capture_file", lambda *a, loaded=None, **k: calls.append("in-kernel") or
                        _fake_capture_in_kernel(*a, **k))
    run = batch.load_run(tmp_path / "new", {"seq_len": 512, "bucket_size": 64, "docs": 2, "n_pairs": 8,
                                            "unrelated": 1, "__name__": "__main__"})
    assert run.options.seq_len == 512 and run.analysis.n_pairs == 8 and calls == ["in-kernel"]
    # the next notebook, without overrides, finds the settings the first one recorded
    again = batch.load_run(tmp_path / "new")
    assert again.options == run.options and calls == ["in-kernel"]
    with pytest.raises(TypeError, match="unknown option"):
        batch.load_run(tmp_path / "new", sequence_length=5)


def _fake_capture_in_kernel(options, out, **_):
    from qkplast.io import save_capture
    from qkplast.theory.planted import planted_capture

    cap, _ = planted_capture(n_heads=2, dim=8, seq_len=options.seq_len, bucket_size=options.bucket_size,
                             n_docs=options.docs, samples_per_bucket=2)
    save_capture(cap, out)
    return cap


def test_split_parameters_types_each_kind():
    cap, ana, nb = batch.split_parameters(
        [("seq_len", "4096"), ("rope_scaling", "yarn:4:32768"), ("heads", "all"), ("edge_fraction", "0.25"),
         ("checkpoints", "['a/b@r1']"), ("code_corpus", "stdlib-code")],
        {"checkpoints": [], "code_corpus": "stdlib-code", "n_boot": 40})
    assert cap == {"seq_len": 4096, "rope_scaling": "yarn:4:32768", "heads": None}
    assert ana == {"edge_fraction": 0.25} and nb == {"checkpoints": ["a/b@r1"], "code_corpus": "stdlib-code"}
    with pytest.raises(ValueError, match="checkpoints expects list"):
        batch.split_parameters([("checkpoints", "a/b")], {"checkpoints": []})


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
    _fake_stage(monkeypatch, tmp_path)
    from qkplast import CaptureOptions

    tiny = CaptureOptions(seq_len=512, bucket_size=64, docs=2)
    # cell 3 of the executed copy: papermill inserts the injected-parameters cell after the parameters cell
    with pytest.raises(batch.RunError, match=r"01_bad.ipynb failed in cell 3: ValueError: planted failure"):
        batch.run(tiny, tmp_path / "run", notebooks=[bad / "01_bad.ipynb"], progress=False)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["notebooks"][0]["error"].startswith("ValueError")


def test_load_run_takes_the_settings_of_a_capture_made_without_a_run(tmp_path, monkeypatch):
    """``qkplast capture --out RUN/capture.nc`` then a notebook: the settings come from the capture's attrs."""
    from qkplast import CaptureOptions
    from qkplast.io import save_capture
    from qkplast.theory.planted import planted_capture

    calls = _fake_stage(monkeypatch, tmp_path)
    options = CaptureOptions(seq_len=1024, bucket_size=128, docs=3, corpus="pydoc-topics")
    cap, _ = planted_capture(n_heads=2, dim=8, seq_len=1024, bucket_size=128, n_docs=3, samples_per_bucket=2)
    cap.attrs.update(options.to_dict())
    (tmp_path / "run").mkdir()
    save_capture(cap, tmp_path / "run" / "capture.nc")
    run = batch.load_run(tmp_path / "run")
    assert run.options == options and calls == []
    with pytest.raises(batch.RunError, match="seq_len: 1024 there, 2048 asked"):
        batch.load_run(tmp_path / "run", seq_len=2048, bucket_size=128)


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
    _fake_stage(monkeypatch, tmp_path)
    from qkplast import CaptureOptions

    tiny = CaptureOptions(seq_len=512, bucket_size=64, docs=2)
    # a relative run directory: papermill moves the working directory while a notebook runs, and the manifest
    # is written meanwhile
    monkeypatch.chdir(tmp_path)
    result = batch.run(tiny, "run", notebooks=[p.relative_to(tmp_path) for p in paths], progress=False, jobs=2)
    spans = [json.loads((tmp_path / "run" / f"{i}.json").read_text()) for i in (1, 2)]
    assert max(s[0] for s in spans) < min(s[1] for s in spans)  # both kernels were inside their sleep at once
    assert [e["name"] for e in result.manifest["notebooks"]] == ["01_sleep.ipynb", "02_sleep.ipynb"]
    assert all(e["status"] == "ok" for e in result.manifest["notebooks"])
    assert list((tmp_path / "run").glob("bootstrap*.nc"))  # made once before the notebooks, not by each of them
    bad = _sleepy_notebook(folder, "03_bad.ipynb", "raise ValueError('planted failure')")
    with pytest.raises(batch.RunError, match=r"03_bad.ipynb failed in cell 3: ValueError: planted failure"):
        batch.run(tiny, tmp_path / "run", notebooks=[*paths, bad], progress=False, jobs=2)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert [(e["name"], e["status"]) for e in manifest["notebooks"]] == [
        ("01_sleep.ipynb", "ok"), ("02_sleep.ipynb", "ok"), ("03_bad.ipynb", "failed")]

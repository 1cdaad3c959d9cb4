"""Batches: a papermill run on a tiny configuration produces every artifact; notebook parameters agree
with the package defaults; capture reuse refuses other parameters."""

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from qkplast import batch
from qkplast.io import CaptureError

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))
TINY = {"docs": 2, "seq_len": 256, "bucket_size": 32, "samples_per_bucket": 4, "heads": 12}


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
    assert len(NOTEBOOKS) == 11
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


def test_notebook_parameters_match_the_package_defaults():
    for py in NOTEBOOKS:
        params = parameters_cell(py)
        for key, value in batch.DEFAULTS.items():
            assert params[key] == value, f"{py.name}: {key} = {params[key]!r}, batch.DEFAULTS has {value!r}"
        assert params["run_dir"] == "../runs/smollm2-135m" and params["analysis"] == {}


@pytest.mark.slow
def test_tiny_papermill_batch_produces_every_artifact(tmp_path):
    out = tmp_path / "run"
    result = batch.run("smollm2-135m", out, parameters={**TINY, "n_pairs": 32}, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest == json.loads(json.dumps(result.manifest, default=str))
    assert (out / "capture.nc").is_file() and (out / "metrics.nc").is_file()
    # -p n_pairs 32 reached the analysis of the run and of every notebook (they reuse metrics.nc)
    from qkplast.io import open_dataset

    assert open_dataset(out / "metrics.nc").attrs["options"]["n_pairs"] == 32
    assert manifest["parameters"]["analysis"]["n_pairs"] == 32
    names = sorted(p.name for p in (out / "notebooks").glob("*.ipynb"))
    assert names == sorted(p.with_suffix(".ipynb").name for p in NOTEBOOKS)
    for name in names:
        nb = nbformat.read(out / "notebooks" / name, 4)
        errors = [
            o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"
        ]
        assert not errors, name
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert injected and "seq_len = 256" in injected[0].source
    assert set(manifest["versions"]) >= {"qkplast", "torch", "transformers", "papermill"}
    assert manifest["parameters"]["seq_len"] == 256 and manifest["device"] == "cpu"
    table = batch.compare([out])
    assert table.loc["run", "seq_len"] == 256 and 0 < table.loc["run", "ap_overall"] < 1
    profiles = batch.context_profiles([out, out])
    assert profiles.dims == ("run", "context_bin") and profiles.sizes["context_bin"] == 5
    from qkplast.plots import compare_profiles

    assert len(compare_profiles(profiles.isel(run=[0])).axes[0].lines) == 1
    # a second run reuses the capture; other capture parameters are refused, not silently mixed
    with pytest.raises(CaptureError, match="docs: file has 2, asked 3"):
        batch.load_or_capture(out, **{**TINY, "docs": 3})


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
    monkeypatch.setattr(batch, "load_or_capture", lambda *a, **k: None)
    monkeypatch.setattr(batch, "load_or_analyze", lambda *a, **k: (None, []))
    # cell 3 of the executed copy: papermill inserts the injected-parameters cell after the parameters cell
    with pytest.raises(batch.RunError, match=r"01_bad.ipynb failed in cell 3: ValueError: planted failure"):
        batch.run("smollm2-135m", tmp_path / "run", notebooks=[bad / "01_bad.ipynb"], progress=False)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["notebooks"][0]["error"].startswith("ValueError")

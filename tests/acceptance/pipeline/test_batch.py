"""A papermill batch on a tiny configuration of the embedded model produces every artifact, and a rerun executes
nothing again."""

import json

import nbformat

from qkplast import rundir
from qkplast.pipeline import stages
from qkplast.results import summary
from tests.helpers import NOTEBOOKS, TINY


def test_tiny_papermill_batch_produces_every_artifact(tmp_path, tiny_notebooks):
    from dataclasses import fields

    from qkplast import AnalysisOptions, CaptureOptions
    from qkplast.io import open_capture, open_dataset
    from qkplast.options import PRESETS

    out = tmp_path / "run"
    tiny = CaptureOptions(**{**PRESETS["fast"].to_dict(), **TINY})
    result = stages.run(tiny, out, analysis=AnalysisOptions(n_pairs=32), parameters=tiny_notebooks, progress=False)
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
    table = summary.compare([out])
    assert table.loc["run", "seq_len"] == 256 and 0 < table.loc["run", "ap_overall"] < 1
    profiles = summary.context_profiles({"a": rundir.open_metrics(out), "b": rundir.open_metrics(out)})
    assert profiles.dims == ("run", "context_bin") and profiles.sizes["context_bin"] == 5
    # a rerun executes nothing again
    again = stages.run(tiny, out, parameters=tiny_notebooks, progress=False)
    assert [e["seconds"] for e in again.manifest["notebooks"]] == [e["seconds"] for e in manifest["notebooks"]]

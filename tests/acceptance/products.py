"""What every finished run directory holds, checked on the acceptance tier's runs (``check_products``)."""

from __future__ import annotations

from pathlib import Path


def check_products(out: Path, manifest: dict, seq_len: int) -> None:
    """Every artifact of a finished run and one set of names: CaptureOptions fields == manifest keys == capture
    attrs, the run's analysis options in its metrics, every notebook executed without an error with the run directory
    injected, and the cross-run tables reading it."""
    from dataclasses import fields

    import nbformat

    from qkplast import CaptureOptions, rundir
    from qkplast.capture_format import open_capture, open_dataset
    from qkplast.options import AnalysisOptions
    from qkplast.results import summary
    from tests.helpers import NOTEBOOKS

    attrs = open_capture(out / "capture.nc").attrs
    assert list(manifest["capture"]) == [f.name for f in fields(CaptureOptions)]
    for name, value in manifest["capture"].items():
        assert name in attrs, f"capture attrs lack {name}"
        if name not in ("device", "dtype"):
            assert attrs[name] == value, (name, attrs[name], value)
    assert "commit" in attrs and "revision" in attrs and manifest["commit"] == attrs["commit"]
    assert (out / "metrics.nc").is_file()
    assert (out / "code" / "capture.nc").is_file() == (manifest["code"]["options"] is not None)
    # the run's analysis options reached the metrics, by the same names
    recorded = open_dataset(out / "metrics.nc").attrs["options"]
    assert AnalysisOptions(**manifest["analysis"]).result_key() == AnalysisOptions(**{
        k: v for k, v in recorded.items() if k in AnalysisOptions.__dataclass_fields__}).result_key()
    names = sorted(p.name for p in (out / "notebooks").glob("*.ipynb"))
    assert names == sorted(p.with_suffix(".ipynb").name for p in NOTEBOOKS)
    assert manifest["status"] == "ok" and [e["status"] for e in manifest["notebooks"]] == ["ok"] * len(names)
    for name in names:
        nb = nbformat.read(out / "notebooks" / name, 4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
        assert not errors, name
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert injected and f'run_dir = "{out.resolve()}"' in injected[0].source
    assert set(manifest["versions"]) >= {"qkplast", "torch", "transformers", "papermill"}
    table = summary.compare([out])
    assert table.loc[out.name, "seq_len"] == seq_len and 0 < table.loc[out.name, "ap_overall"] < 1
    profiles = summary.context_profiles({"a": rundir.open_metrics(out), "b": rundir.open_metrics(out)})
    assert profiles.dims == ("run", "context_bin") and profiles.sizes["context_bin"] == 5

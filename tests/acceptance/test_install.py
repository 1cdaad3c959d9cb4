"""Install: a non-editable ``pip install .`` (what a GPU host or a cluster does) runs ``qkplast run`` end to end.

The wheel carries the notebooks and the thesis tables inside the package (``setup.py``, ``qkplast/resources.py``);
the run below imports only the installed copy (run from outside the checkout, with the install first on the path).
The same run is the tier's check of a batch's products (every artifact, one set of option names from the flags
to the manifest to the capture's attributes, the injected parameters) and of a rerun that executes nothing
again: one tiny run through every notebook serves both (it was two, about two minutes each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import ROOT



def test_a_non_editable_install_runs_qkplast_run_end_to_end(tmp_path, tiny_notebooks):
    from tests.helpers import TINY

    site = tmp_path / "site"
    t0 = time.perf_counter()
    built = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                            "--target", str(site), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_WAIT_POLICY": "PASSIVE"}
    where = subprocess.run([sys.executable, "-c", "import qkplast, qkplast.pipeline.params as p, qkplast.results.reference "
                            "as r; print(qkplast.__file__); print(p.NOTEBOOK_DIR); print(r.data_dir()); "
                            "print(len(p.notebook_paths()), len(r.load('models'))); "
                            # chapter 07's stored coverage table and chapter 10's default training study
                            "import qkplast.resources as s, qkplast.train.run as t, qkplast.results.tables as rt; "
                            "print(s.resource_dir('data')); print(t.STUDIES); print(len(rt.coverage_results())); "
                            "from qkplast.train.config import load_train_study; "
                            "print(load_train_study(t.STUDIES / 'miniature.yaml').name)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    package, notebooks, data, counts, coverage, studies, rows, study = where.stdout.split("\n")[:8]
    for path in (package, notebooks, data, coverage, studies):
        assert Path(path).is_relative_to(site), (path, site)  # the installed copy, not the checkout
    assert int(rows) > 0 and study == "miniature"
    assert counts == f"{len(list((ROOT / 'notebooks').glob('[0-9][0-9]_*.ipynb')))} 13"
    out = tmp_path / "run"
    argv = ["run", "--preset", "fast", *[f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()], "--n-pairs=32",
            "--out", str(out), "--no-progress"]
    for name, value in tiny_notebooks.items():
        argv += ["-p", name, json.dumps(value)]

    def run():
        return subprocess.run([sys.executable, "-m", "qkplast.pipeline.cli", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=1800)

    ran = run()
    assert ran.returncode == 0, (ran.stdout[-2000:], ran.stderr[-3000:])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and len(manifest["notebooks"]) == 13
    assert all(e["status"] == "ok" for e in manifest["notebooks"])
    print(f"install + run from the wheel: {time.perf_counter() - t0:.0f} s")
    check_products(out, manifest)
    again = run()  # a rerun executes nothing again
    assert again.returncode == 0, (again.stdout[-2000:], again.stderr[-3000:])
    rerun = json.loads((out / "manifest.json").read_text())
    assert [e["seconds"] for e in rerun["notebooks"]] == [e["seconds"] for e in manifest["notebooks"]]


def check_products(out: Path, manifest: dict) -> None:
    """Every artifact of a run and one set of names: CaptureOptions fields == manifest keys == capture attrs."""
    from dataclasses import fields

    import nbformat

    from qkplast import CaptureOptions, rundir
    from qkplast.capture_format import open_capture, open_dataset
    from qkplast.results import summary
    from tests.helpers import NOTEBOOKS

    attrs = open_capture(out / "capture.nc").attrs
    assert list(manifest["capture"]) == [f.name for f in fields(CaptureOptions)]
    for name, value in manifest["capture"].items():
        assert name in attrs, f"capture attrs lack {name}"
        if name not in ("device", "dtype"):
            assert attrs[name] == value, (name, attrs[name], value)
    assert "commit" in attrs and "revision" in attrs and manifest["commit"] == attrs["commit"]
    assert (out / "metrics.nc").is_file() and (out / "code" / "capture.nc").is_file()
    assert open_dataset(out / "metrics.nc").attrs["options"]["n_pairs"] == 32  # the flag reached the analysis
    names = sorted(p.name for p in (out / "notebooks").glob("*.ipynb"))
    assert names == sorted(p.with_suffix(".ipynb").name for p in NOTEBOOKS)
    for name in names:
        nb = nbformat.read(out / "notebooks" / name, 4)
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
        assert not errors, name
        injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        assert injected and f'run_dir = "{out.resolve()}"' in injected[0].source
    assert set(manifest["versions"]) >= {"qkplast", "torch", "transformers", "papermill"}
    table = summary.compare([out])
    assert table.loc["run", "seq_len"] == 256 and 0 < table.loc["run", "ap_overall"] < 1
    profiles = summary.context_profiles({"a": rundir.open_metrics(out), "b": rundir.open_metrics(out)})
    assert profiles.dims == ("run", "context_bin") and profiles.sizes["context_bin"] == 5

"""A chapter that reads a finished run imports neither torch, transformers, scipy nor the capture stack.

Chapters 02-04, 08, 09 and 11 open a run directory whose capture, metrics and bootstrap exist and draw its tables
and figures: their kernels import numpy, pandas, xarray, h5netcdf and matplotlib, and the packages load torch
(analysis, stats), scipy (theory checks, intervals) and transformers (the capture stack, ``quiet_transformers``)
on first use, where something is computed or a model loads. Those imports once took about 6 s of each chapter's
9-15 s; ``python -X importtime`` of the chapters' import lines shows what is left.
"""

import json
import os
import re
import subprocess
import sys
import warnings

import numpy as np

from tests.helpers import ROOT

#: The chapters that read a finished run without computing on tensors (01 computes a model's own RoPE, 05 and 06
#: compute pair statistics: they import torch by design).
LIGHT_CHAPTERS = ("02", "03", "04", "08", "09", "11")
#: Modules none of them may load: the numerical stack beyond numpy/pandas/xarray, and the capture stack.
HEAVY = ("torch", "transformers", "scipy", "qkplast.capture.driver", "qkplast.capture.models",
         "qkplast.analysis.metrics", "qkplast.stats.bootstrap")
N_BOOT = 20


def chapter_imports() -> str:
    """The top-level import lines of the light chapters' .py files (a study's cells import more, indented)."""
    lines = []
    for chapter in LIGHT_CHAPTERS:
        (path,) = (ROOT / "notebooks").glob(f"{chapter}_*.py")
        lines += [line for line in path.read_text().splitlines() if re.match(r"(import|from) \S+", line)]
    assert any("chapter_run" in line for line in lines) and any("figures as qp" in line for line in lines)
    return "\n".join(dict.fromkeys(lines))


_CHILD = """
import json, sys
{imports}
from qkplast.results import reference

HEAVY = {heavy!r}
loaded = lambda: sorted(m for m in HEAVY if m in sys.modules)
run = chapter_run(sys.argv[1], {{}})
metrics, capture = run.metrics, run.capture
boot = run.bootstrap({n_boot})
results.with_intervals(boot), results.geometry_table(metrics), results.bias_share(metrics)
results.gaussian_agreement(metrics)
quintiles = results.quintile_table({{"planted": metrics}})
for fig in (qp.sampling_coverage(capture), qp.pc_correlations(metrics), qp.taxonomy_scatter(metrics),
            qp.axis_reversal(metrics), qp.ab_plane(capture, metrics, 0), qp.bias_distribution(metrics),
            qp.bias_vs_separation(metrics), qp.quintile_profiles(quintiles), qp.plasticity_map(metrics),
            qp.plasticity_profile(metrics),
            qp.benchmark_scatter(reference.load("longbench_matched"), {{"planted": float(metrics.ap_drop.mean())}})):
    assert fig is not None
code, note = run.code("stdlib-code")
reading = loaded()
# chapters 08 and 11 compute correlations with scipy.stats: that alone, never torch nor transformers
results.bias_by_layer_band(metrics), results.benchmark_correlations()
print(json.dumps({{"code": code is None and note, "reading": reading, "correlations": loaded(),
                  "scipy_stats": "scipy.stats" in sys.modules}}))
"""


def plant_finished_run(run_dir):
    """A run directory as ``qkplast run`` leaves it: capture, metrics, bootstrap and the code capture's record."""
    from qkplast import AnalysisOptions, CaptureOptions
    from qkplast.analysis.pairs import PlasticityWarning
    from qkplast.capture_format import save_capture
    from qkplast.rundir import load_run
    from qkplast.rundir.products import write_manifest
    from qkplast.theory.planted import planted_capture

    options = CaptureOptions(seq_len=1024, bucket_size=128, docs=4, corpus="pydoc-topics")
    cap, _ = planted_capture(n_heads=6, dim=8, seq_len=1024, bucket_size=128, n_docs=4, samples_per_bucket=4, seed=3)
    cap = cap.assign_coords(layer=("head", np.arange(6) // 2), q_head=("head", np.arange(6) % 2),
                            kv_head=("head", np.zeros(6, int)))
    cap.attrs.update(options.to_dict())
    run_dir.mkdir()
    save_capture(cap, run_dir / "capture.nc")
    write_manifest(run_dir, {"capture": options.to_dict(), "analysis": AnalysisOptions(n_pairs=32).to_dict(),
                             "code": {"corpus": "stdlib-code", "options": None, "status": "skipped",
                                      "note": "code capture left out (planted run)"}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlasticityWarning)
        load_run(run_dir).bootstrap(N_BOOT)  # metrics.nc and bootstrap.nc, made here (torch is loaded in this process)
    assert {"capture.nc", "metrics.nc", "bootstrap.nc"} <= {p.name for p in run_dir.iterdir()}


def test_the_light_chapters_read_a_finished_run_without_torch_scipy_or_transformers(tmp_path):
    plant_finished_run(tmp_path / "run")
    child = _CHILD.format(imports=chapter_imports(), heavy=HEAVY, n_boot=N_BOOT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", child, str(tmp_path / "run")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == "code capture left out (planted run)"  # chapter 09's record was read, nothing sized
    assert result["reading"] == [], f"opening a finished run and drawing its tables and figures imported {result['reading']}"
    assert result["scipy_stats"] and result["correlations"] == ["scipy"], result

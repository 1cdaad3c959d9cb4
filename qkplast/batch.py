"""Batches: capture, analyse and execute every notebook for one model (``qkplast run``).

A *run directory* holds everything one model's batch produced::

    RUN/capture.nc        the capture (qkplast.io contract)
    RUN/metrics.nc        qkplast.analyze with the run's options
    RUN/notebooks/*.ipynb the executed notebooks (papermill)
    RUN/manifest.json     parameters, package versions, device, timings

Notebooks call :func:`load_or_capture` and :func:`load_or_analyze` with their
parameters, so the same notebook works inside a batch (where the files exist)
and on its own, e.g. under nbval (where the first notebook creates them).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import io
import json
import os
import platform
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pandas as pd
import xarray as xr

from .errors import QkplastError
from .io import CaptureError, open_capture, open_dataset, save_dataset
from .options import AnalysisOptions

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"

#: Capture parameters of the embedded default run. Every notebook's parameters
#: cell repeats them as literals (papermill needs literals); a test keeps the two equal.
DEFAULTS = {
    "model": "smollm2-135m",
    "corpus": "pydoc-topics",
    "docs": 8,
    "seq_len": 2048,
    "bucket_size": 128,
    "samples_per_bucket": 4,
    "heads": 300,
    "seed": 0,
    "device": "cpu",
    "dtype": "auto",
    "rope_scaling": None,
}
CAPTURE_KEYS = tuple(DEFAULTS)


class RunError(QkplastError):
    """A batch step failed; the message names the notebook and cell."""


@contextlib.contextmanager
def _quiet():
    """Silence transformers' progress bars and logging so notebook outputs stay deterministic."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        transformers.logging.set_verbosity(verbosity)
        transformers.logging.enable_progress_bar()


#: capture parameter -> the capture attribute that records it (device and dtype may differ legitimately)
_RECORDED = {"model": "model", "corpus": "corpus", "docs": "docs_requested", "seq_len": "seq_len",
             "bucket_size": "bucket_size", "samples_per_bucket": "samples_per_bucket", "heads": "heads_requested",
             "seed": "seed"}


def _capture_mismatches(attrs: dict, params: dict) -> list[str]:
    """Differences between a capture's recorded parameters and the requested ones."""
    from .models import parse_rope_scaling

    wanted = {**params, "rope_scaling": parse_rope_scaling(params["rope_scaling"])}
    recorded = {**_RECORDED, "rope_scaling": "rope_scaling"}
    return [f"{k}: file has {attrs.get(a)!r}, asked {wanted[k]!r}" for k, a in recorded.items()
            if attrs.get(a) != wanted[k]]


def load_or_capture(run_dir: str | os.PathLike, revision: str | None = None, **params) -> xr.Dataset:
    """Open ``RUN/capture.nc``, or capture it first with ``params`` (keys of :data:`DEFAULTS`).

    ``revision`` selects a hub revision of ``model`` (a training checkpoint).
    The capture streams to ``RUN/capture.nc.parts/`` and resumes if interrupted.
    An existing capture made with other parameters is an error, never silently reused.
    """
    params = {**DEFAULTS, **params}
    unknown = sorted(set(params) - set(CAPTURE_KEYS))
    if unknown:
        raise TypeError(f"unknown capture parameter(s) {unknown}; valid: {list(CAPTURE_KEYS)}")
    run_dir = Path(run_dir)
    path = run_dir / "capture.nc"
    if not path.exists():
        from .capture import run_capture

        run_dir.mkdir(parents=True, exist_ok=True)
        with _quiet():
            run_capture(params["model"], params["corpus"], path, seq_len=params["seq_len"], device=params["device"],
                        dtype=params["dtype"], rope_scaling=params["rope_scaling"], revision=revision, bucket_size=params["bucket_size"],
                        samples_per_bucket=params["samples_per_bucket"], heads=params["heads"], seed=params["seed"],
                        docs=params["docs"], progress=False)
    cap = open_capture(path)
    diff = _capture_mismatches(cap.attrs, params)
    if diff:
        raise CaptureError(f"{path} was captured with other parameters ({'; '.join(diff)}); "
                           "use another run directory or delete it")
    return cap


def _cached_path(run_dir: Path, stem: str, key: dict, read_key) -> Path:
    """``RUN/STEM.nc`` for the run's own settings; another setting gets ``RUN/STEM-<hash>.nc``.

    So an analysis with other options (a notebook comparing against the thesis defaults, say) never
    overwrites the run's main results.
    """
    main = run_dir / f"{stem}.nc"
    if not main.exists() or read_key(main) == key:
        return main
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return run_dir / f"{stem}-{digest}.nc"


def load_or_analyze(run_dir: str | os.PathLike, capture: xr.Dataset, **options) -> tuple[xr.Dataset, list[str]]:
    """Open the run's metrics if they were made with these options, else analyse and save them.

    Returns the metrics and the analysis warnings as text (the notebooks print
    them, so they appear in the output without machine-specific file paths).
    """
    from .analyze import analyze

    opt = AnalysisOptions.from_kwargs(None, **options)
    key_of = lambda p: AnalysisOptions.from_kwargs(None, **open_dataset(p).attrs.get("options", {})).result_key()  # noqa: E731
    path = _cached_path(Path(run_dir), "metrics", opt.result_key(), key_of)
    if path.exists():
        metrics = open_dataset(path)
        return metrics, list(metrics.attrs.get("warnings", []))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = analyze(capture, opt)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    metrics.attrs["warnings"] = messages
    save_dataset(metrics, path, overwrite=True)
    return metrics, messages


def load_or_bootstrap(run_dir: str | os.PathLike, capture: xr.Dataset, n_boot: int = 40, seed: int = 0,
                      **options) -> xr.Dataset:
    """Open the run's bootstrap if it was made with these settings, else compute and save it."""
    from .bootstrap import bootstrap

    opt = AnalysisOptions.from_kwargs(None, seed=seed, **options)
    key = {"n_boot": n_boot, "seed": seed, "options": opt.result_key()}
    path = _cached_path(Path(run_dir), "bootstrap", key, lambda p: open_dataset(p).attrs.get("key"))
    if path.exists():
        return open_dataset(path)
    ds = bootstrap(capture, n_boot=n_boot, seed=seed, options=opt)
    ds.attrs["key"] = key
    save_dataset(ds, path, overwrite=True)
    return ds


# --------------------------------------------------------------------------- qkplast run


def notebook_paths(directory: Path = NOTEBOOK_DIR) -> list[Path]:
    paths = sorted(directory.glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        raise RunError(f"no notebooks found in {directory}")
    return paths


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for pkg in ("qkplast", "torch", "transformers", "numpy", "scipy", "xarray", "papermill"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _literal(text: str):
    """Parse a ``-p name value`` value: a Python literal (number, list, dict, quoted string) or a bare string."""
    low = text.lower()
    if low in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[low]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


@dataclass
class RunResult:
    run_dir: Path
    manifest: dict


def run(model: str, out: str | os.PathLike | None = None, *, device: str = "cpu", parameters: dict | None = None,
        notebooks: list[Path] | None = None, overwrite: bool = False, progress: bool = True) -> RunResult:
    """Capture, analyse and execute every notebook for ``model``; write a manifest.

    ``parameters`` are passed to every notebook (papermill ``-p``); those that
    a notebook does not declare are ignored by it. A failing notebook raises
    :class:`RunError` naming the notebook, the cell and the error; the
    manifest then records the failure.
    """
    import papermill as pm

    out = Path(out or Path("runs") / model.replace("/", "__"))
    params = {**DEFAULTS, **(parameters or {}), "model": model, "device": device}
    nb_out = out / "notebooks"
    if out.exists() and overwrite:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    nb_out.mkdir(exist_ok=True)
    manifest = {"model": model, "device": device, "parameters": params, "versions": _versions(),
                "command": sys.argv, "timings_s": {}, "notebooks": [], "status": "running"}
    if device.startswith("cuda"):
        import torch

        manifest["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None

    def write_manifest():
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))

    capture_params = {k: v for k, v in params.items() if k in CAPTURE_KEYS}
    t0 = time.perf_counter()
    cap = load_or_capture(out, **capture_params)
    manifest["timings_s"]["capture"] = round(time.perf_counter() - t0, 2)
    # analysis options given as -p NAME VALUE reach every notebook as its `analysis` parameter
    analysis = {**params.pop("analysis", {}),
                **{k: v for k, v in params.items() if k in AnalysisOptions.__dataclass_fields__ and k != "seed"}}
    params["analysis"] = analysis
    t0 = time.perf_counter()
    load_or_analyze(out, cap, seed=params["seed"], **analysis)
    manifest["timings_s"]["analyze"] = round(time.perf_counter() - t0, 2)
    write_manifest()

    nb_params = {**params, "run_dir": str(out.resolve())}
    for path in notebooks or notebook_paths():
        t0 = time.perf_counter()
        target = nb_out / path.name
        try:
            pm.execute_notebook(str(path), str(target), parameters=nb_params, cwd=str(path.parent),
                                progress_bar=progress, kernel_name="python3")
        except pm.PapermillExecutionError as exc:
            manifest["status"] = "failed"
            manifest["notebooks"].append({"name": path.name, "status": "failed", "cell": exc.exec_count,
                                          "error": f"{exc.ename}: {exc.evalue}"})
            write_manifest()
            raise RunError(f"notebook {path.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}\n"
                           f"(executed copy with the traceback: {target})") from exc
        manifest["notebooks"].append({"name": path.name, "status": "ok",
                                      "seconds": round(time.perf_counter() - t0, 2)})
        manifest["timings_s"][path.stem] = round(time.perf_counter() - t0, 2)
        write_manifest()
    manifest["status"] = "ok"
    write_manifest()
    return RunResult(out, manifest)


# --------------------------------------------------------------------------- comparison


SUMMARY = {
    "heads": lambda m: m.sizes["head"],
    "evr_pc0": lambda m: float(m.explained_variance_ratio[:, 0].mean()),
    "abs_r_q_pc0": lambda m: float(abs(m.r_q_pc[:, 0]).mean()),
    "abs_r_k_pc0": lambda m: float(abs(m.r_k_pc[:, 0]).mean()),
    "abs_r_q_a": lambda m: float(abs(m.r_q_a).mean()),
    "abs_r_k_a": lambda m: float(abs(m.r_k_a).mean()),
    "share_bias_positive": lambda m: float((m.bias_strength > 0).mean()),
    "mean_bias_strength": lambda m: float(m.bias_strength.mean()),
    "plane_variance_fraction": lambda m: float(m.plane_variance_fraction.mean()),
    "ap_overall": lambda m: float(m.ap_overall.mean()),
    "ap_first20": lambda m: float(m.ap_first20.mean()),
    "ap_last20": lambda m: float(m.ap_last20.mean()),
    "ap_drop": lambda m: float(m.ap_drop.mean()),
}


def summarize(metrics: xr.Dataset) -> dict:
    """Model-level means of the headline metrics (the quantities of chapter 6)."""
    out = {name: fn(metrics) for name, fn in SUMMARY.items()}
    tax = pd.Series(metrics.taxonomy.values).value_counts(normalize=True)
    for name in ("position-dominated", "q-positional", "content-focused", "mixed"):
        out[f"share_{name}"] = float(tax.get(name, 0.0))
    return out


def compare(run_dirs: list[str | os.PathLike]) -> pd.DataFrame:
    """One row per run directory: model, corpus, context and the headline metrics."""
    rows = []
    for d in run_dirs:
        d = Path(d)
        metrics = open_dataset(d / "metrics.nc")
        cap_attrs = metrics.attrs.get("capture", {})
        rows.append({"run": d.name, "model": cap_attrs.get("model"), "corpus": cap_attrs.get("corpus"),
                     "seq_len": cap_attrs.get("seq_len"), **summarize(metrics)})
    if not rows:
        raise RunError("compare needs at least one run directory")
    return pd.DataFrame(rows).set_index("run")


def context_profiles(run_dirs: list[str | os.PathLike]) -> xr.DataArray:
    """Mean plasticity profile per run over the context fraction bins (dims ``run, context_bin``)."""
    profiles = []
    for d in run_dirs:
        m = open_dataset(Path(d) / "metrics.nc")
        profiles.append(m.ap_context.mean("head").expand_dims(run=[Path(d).name]))
    return xr.concat(profiles, "run")


__all__ = ["DEFAULTS", "RunError", "compare", "context_profiles", "load_or_analyze", "load_or_bootstrap",
           "load_or_capture", "run", "summarize"]

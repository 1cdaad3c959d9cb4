"""Batches: capture, analyse and execute every notebook for one model (``qkplast run``).

A *run directory* holds everything one model's batch produced::

    RUN/manifest.json        capture and analysis options (CaptureOptions / AnalysisOptions, same names),
                             notebook parameters, versions, resolved commit, timings, status
    RUN/capture.nc           the capture (qkplast.io contract)
    RUN/metrics.nc           qkplast.analyze with the run's analysis options
    RUN/code/                the same for the code corpus (notebook 09): manifest.json, capture.nc, metrics.nc
    RUN/notebooks/*.ipynb    the executed notebooks (papermill)

:func:`run` loads the model once, makes every capture the notebooks need, releases
the model (and the GPU memory) and only then starts the notebooks, which find
their files and never load a model. Notebooks call :func:`load_run`, which reads
the settings from ``RUN/manifest.json`` (the :class:`CaptureOptions` defaults
when the run is new), so the same notebook works inside a batch and on its own
(under nbval, where the first notebook captures with the defaults).
"""

from __future__ import annotations

import ast
import contextlib
import gc
import hashlib
import io
import json
import os
import platform
import re
import shutil
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, fields, replace
from importlib import metadata
from pathlib import Path

import pandas as pd
import xarray as xr

from qkplast.errors import QkplastError
from qkplast.io import CaptureError, open_capture, open_dataset, save_dataset
from qkplast.options import CAPTURE_EXECUTION_OPTIONS, AnalysisOptions, CaptureOptions, UnknownOptionError, coerce_value, typed_option

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
#: Corpus of the code capture that notebook 09 sets beside the prose (its ``code_corpus`` parameter).
CODE_CORPUS = "stdlib-code"
#: Sub-directory of a run that holds the code capture.
CODE_DIR = "code"
STAGES = ("capture", "analyze", "notebooks")

_CAPTURE_FIELDS = tuple(f.name for f in fields(CaptureOptions))
_ANALYSIS_FIELDS = tuple(f.name for f in fields(AnalysisOptions))


class RunError(QkplastError):
    """A batch step failed or a run directory holds other settings; the message names which and the fix."""


@contextlib.contextmanager
def quiet_transformers():
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


# --------------------------------------------------------------------------- parameters


def _literal(text: str):
    """Parse a ``-p name value`` value: a Python literal (number, list, dict, quoted string) or a bare string."""
    low = text.lower()
    if low in ("true", "false", "none"):
        return {"true": True, "false": False, "none": None}[low]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _parameters_cell(source: str) -> dict:
    """Literal assignments of the cell tagged ``parameters`` in a py:percent notebook source."""
    match = re.search(r'# %% tags=\["parameters"\]\n(.*?)(?=\n# %%|\Z)', source, re.S)
    if not match:
        return {}
    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.parse(match.group(1)).body
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}


def _declared_parameters(path: Path) -> dict:
    """The parameters one notebook declares (name -> default), from its ``.ipynb`` (what papermill runs)."""
    import nbformat

    nb = nbformat.read(path, 4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    return _parameters_cell('# %% tags=["parameters"]\n' + cells[0].source) if cells else {}


def notebook_parameters(directory: Path = NOTEBOOK_DIR) -> dict:
    """Every parameter the notebooks declare (name -> default), from their ``.py`` sources (or ``.ipynb``)."""
    out = {}
    for path in notebook_paths(directory):
        py = path.with_suffix(".py")
        out.update(_parameters_cell(py.read_text()) if py.exists() else _declared_parameters(path))
    return out


def split_parameters(pairs, notebook_defaults: dict | None = None) -> tuple[dict, dict, dict]:
    """Sort ``-p NAME VALUE`` pairs into capture options, analysis options and notebook parameters, typed.

    A capture or analysis option is typed from its dataclass field, a notebook
    parameter from its default (``-p n_boot 100`` is an int, ``-p checkpoints
    "['a@r']"`` a list). ``seed`` is a capture option; the run's analysis uses it too.

    Raises
    ------
    QkplastError
        An unknown name (listing the valid ones) or a value of the wrong type.
    """
    notebook_defaults = notebook_parameters() if notebook_defaults is None else notebook_defaults
    capture, analysis, notebook = {}, {}, {}
    for name, text in pairs:
        if name in _CAPTURE_FIELDS:
            capture[name] = typed_option(CaptureOptions, name, text)
        elif name in _ANALYSIS_FIELDS:
            analysis[name] = typed_option(AnalysisOptions, name, text)
        elif name in notebook_defaults and name != "run_dir":
            default = notebook_defaults[name]
            value = _literal(text) if not isinstance(default, str) else text
            notebook[name] = value if default is None else coerce_value((type(default),), False, value, name)
        else:
            raise UnknownOptionError(
                f"unknown parameter {name!r}: not a capture option ({', '.join(_CAPTURE_FIELDS)}), an analysis option "
                f"({', '.join(_ANALYSIS_FIELDS)}) or a notebook parameter "
                f"({', '.join(sorted(set(notebook_defaults) - {'run_dir'}))})"
            )
    return capture, analysis, notebook


# --------------------------------------------------------------------------- captures


def release_model(loaded) -> None:
    """Give a loaded model's memory back (see :func:`qkplast.capture.models.release_model`)."""
    from qkplast.capture.models import release_model as release

    release(loaded)


def _load(options: CaptureOptions):
    from qkplast.capture.models import load_model

    return load_model(options.model, device=options.device, dtype=options.dtype, rope_scaling=options.rope_scaling,
                      revision=options.revision, seq_len=options.seq_len, tokenizer=options.tokenizer)


def capture_file(options: CaptureOptions, out, *, overwrite: bool = False, progress: bool = True, loaded=None):
    """Capture ``options`` into ``out`` (resuming ``OUT.parts/``), with an already ``loaded`` model if given."""
    from qkplast.capture.driver import run_capture

    return run_capture(options, out, overwrite=overwrite, progress=progress, loaded=loaded)


def _check_windows(options: CaptureOptions) -> None:
    """Everything checkable without weights (config, kernel, and the corpus filling the windows), in seconds."""
    from qkplast.capture.corpus import open_corpus_for
    from qkplast.capture.models import split_revision
    from qkplast.capture.plan import preflight

    name, revision = split_revision(options.model, options.revision)
    documents = open_corpus_for(options)
    with quiet_transformers():
        preflight(replace(options, model=name, revision=revision), documents)


# --------------------------------------------------------------------------- settings of a run directory


def _manifest(run_dir: Path) -> dict | None:
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RunError(f"{path} is not valid JSON ({exc.msg}); delete it or rerun with --overwrite") from exc


def _write_manifest(run_dir: Path, manifest: dict) -> None:
    path = Path(run_dir) / "manifest.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    os.replace(tmp, path)


def run_settings(run_dir, namespace: dict | None = None, **overrides) -> tuple[CaptureOptions, AnalysisOptions]:
    """The capture and analysis options a run directory was made with (the defaults when it is new).

    ``namespace`` (a notebook's ``globals()``) and ``overrides`` replace fields by name, as in :func:`load_run`.
    """
    manifest = _manifest(Path(run_dir)) or {}
    recorded = manifest.get("capture") or _recorded_in_capture(Path(run_dir) / "capture.nc")
    capture = CaptureOptions(**{k: v for k, v in recorded.items() if k in _CAPTURE_FIELDS})
    analysis = AnalysisOptions(**{k: v for k, v in manifest.get("analysis", {"seed": capture.seed}).items()
                                  if k in _ANALYSIS_FIELDS})
    cap_over, ana_over = _overrides(namespace, overrides)
    if "seed" in cap_over and "seed" not in ana_over:
        ana_over["seed"] = cap_over["seed"]
    return replace(capture, **cap_over), replace(analysis, **ana_over)


def _recorded_in_capture(path: Path) -> dict:
    """The CaptureOptions fields a capture file's attrs record (a capture made by ``qkplast capture --out``)."""
    if not path.exists():
        return {}
    attrs = open_dataset(path).attrs
    return {k: attrs[k] for k in _CAPTURE_FIELDS if k in attrs}


def _differences(recorded: dict, wanted: CaptureOptions) -> list[str]:
    """Settings that change what is captured and differ between a recorded dict and ``wanted``."""
    from qkplast.capture.models import parse_rope_scaling

    out = []
    for name, value in wanted.result_key().items():
        if name not in recorded or name in CAPTURE_EXECUTION_OPTIONS or (name == "dtype" and value == "auto"):
            continue
        have = recorded[name]
        if name == "rope_scaling":
            have, value = parse_rope_scaling(have), parse_rope_scaling(value)
        elif have is not None:
            with contextlib.suppress(QkplastError):
                have = typed_option(CaptureOptions, name, have)
        if have != value:
            out.append(f"{name}: {recorded[name]!r} there, {getattr(wanted, name)!r} asked")
    return out


def _normalized(options: CaptureOptions) -> CaptureOptions:
    """``owner/name@rev`` split into ``model`` and ``revision``, as the capture attrs record them."""
    from qkplast.capture.models import split_revision

    name, revision = split_revision(options.model, options.revision)
    return replace(options, model=name, revision=revision)


def _check_same_capture(run_dir: Path, wanted: CaptureOptions) -> None:
    recorded = (_manifest(run_dir) or {}).get("capture") or _recorded_in_capture(run_dir / "capture.nc")
    if not recorded:
        return
    diff = _differences(recorded, wanted)
    if diff:
        raise RunError(f"{run_dir} was made with other capture settings ({'; '.join(diff)}); "
                       "use another run directory (--out) or --overwrite")


def _ensure_capture(run_dir: Path, options: CaptureOptions, analysis: AnalysisOptions, *, loaded=None,
                    progress: bool = False) -> Path:
    """``RUN/capture.nc`` for ``options``: reused when present (refused if made otherwise), else captured."""
    options = _normalized(options)
    run_dir.mkdir(parents=True, exist_ok=True)
    _check_same_capture(run_dir, options)
    path = run_dir / "capture.nc"
    if not path.exists():
        capture_file(options, path, progress=progress, loaded=loaded)
    manifest = _manifest(run_dir) or {}
    if "capture" not in manifest:
        attrs = open_dataset(path).attrs
        manifest.update(capture=options.to_dict(), analysis=analysis.to_dict(), commit=attrs.get("commit"),
                        status=manifest.get("status", "captured"))
        _write_manifest(run_dir, manifest)
    return path


# --------------------------------------------------------------------------- what notebooks call


def load_or_analyze(run_dir: str | os.PathLike, capture: xr.Dataset, **options) -> tuple[xr.Dataset, list[str]]:
    """Open the run's metrics if they were made with these options, else analyse and save them.

    ``RUN/metrics.nc`` holds the run's own options; another setting goes to
    ``RUN/metrics-<hash>.nc`` and never overwrites them. Returns the metrics and
    the analysis warnings as text (the notebooks print them, so they appear in
    the output without machine-specific file paths).
    """
    from qkplast.analysis.metrics import analyze

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


def _cached_path(run_dir: Path, stem: str, key: dict, read_key) -> Path:
    """``RUN/STEM.nc`` for the run's own settings; another setting gets ``RUN/STEM-<hash>.nc``."""
    main = run_dir / f"{stem}.nc"
    if not main.exists() or read_key(main) == key:
        return main
    digest = hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return run_dir / f"{stem}-{digest}.nc"


def load_or_bootstrap(run_dir: str | os.PathLike, capture: xr.Dataset, n_boot: int = 1000, seed: int = 0,
                      **options) -> xr.Dataset:
    """Open the run's bootstrap if it was made with these settings, else compute and save it (1000 replicates)."""
    from qkplast.stats.bootstrap import bootstrap
    from qkplast.stats.reweight import supports

    opt = AnalysisOptions.from_kwargs(None, seed=seed, **options)
    key = {"n_boot": n_boot, "seed": seed, "options": opt.result_key(),
           "computation": "reweight" if supports(opt) else "exact"}
    path = _cached_path(Path(run_dir), "bootstrap", key, lambda p: open_dataset(p).attrs.get("key"))
    if path.exists():
        return open_dataset(path)
    ds = bootstrap(capture, n_boot=n_boot, seed=seed, options=opt)
    ds.attrs["key"] = key
    save_dataset(ds, path, overwrite=True)
    return ds


@dataclass
class Run:
    """What a notebook needs from a run directory (see :func:`load_run`).

    Attributes
    ----------
    dir : Path
    options : CaptureOptions
        The settings the capture was made with.
    analysis : AnalysisOptions
    capture, metrics : xarray.Dataset
    notes : list of str
        Warnings of the analysis, as text.
    """

    dir: Path
    options: CaptureOptions
    analysis: AnalysisOptions
    capture: xr.Dataset
    metrics: xr.Dataset
    notes: list[str]

    def bootstrap(self, n_boot: int = 40) -> xr.Dataset:
        """Bootstrap over documents with the run's analysis options (cached in the run directory)."""
        opts = {k: v for k, v in self.analysis.to_dict().items() if k != "seed"}
        return load_or_bootstrap(self.dir, self.capture, n_boot=n_boot, seed=self.analysis.seed, **opts)

    @property
    def analysis_overrides(self) -> dict:
        """The analysis options that differ from the defaults, without ``seed`` (for functions taking keywords)."""
        default = AnalysisOptions().to_dict()
        return {k: v for k, v in self.analysis.to_dict().items() if k != "seed" and v != default[k]}

    def on_corpus(self, corpus: str, subdir: str = CODE_DIR) -> "Run":
        """The same capture and analysis settings on another corpus, in ``RUN/<subdir>`` (notebook 09's code)."""
        return _open_run(self.dir / subdir, replace(self.options, corpus=corpus), self.analysis)


def _open_run(run_dir: Path, options: CaptureOptions, analysis: AnalysisOptions) -> Run:
    with quiet_transformers():
        path = _ensure_capture(run_dir, options, analysis)
    capture = open_capture(path)
    metrics, notes = load_or_analyze(run_dir, capture, **analysis.to_dict())
    return Run(run_dir, options, analysis, capture, metrics, notes)


def _overrides(namespace: dict | None, overrides: dict) -> tuple[dict, dict]:
    given = {k: v for k, v in (namespace or {}).items() if k in _CAPTURE_FIELDS + _ANALYSIS_FIELDS}
    given.update(overrides)
    unknown = sorted(set(overrides) - set(_CAPTURE_FIELDS + _ANALYSIS_FIELDS))
    if unknown:
        raise UnknownOptionError(f"unknown option(s) {unknown}: neither CaptureOptions nor AnalysisOptions fields")
    capture = {k: v for k, v in given.items() if k in _CAPTURE_FIELDS}
    analysis = {k: v for k, v in given.items() if k in _ANALYSIS_FIELDS and k != "seed"}
    if "seed" in given:
        analysis["seed"] = given["seed"]
    return capture, analysis


def load_run(run_dir: str | os.PathLike, namespace: dict | None = None, **overrides) -> Run:
    """The capture, metrics and options of a run directory, for a notebook.

    Settings come from ``RUN/manifest.json`` (written by ``qkplast run``), or the
    :class:`CaptureOptions` / :class:`AnalysisOptions` defaults when the run is
    new, in which case the capture is made here (the model loads inside this
    process) and a manifest records its settings for the next notebook.
    Overrides come from ``namespace`` (a notebook passes ``globals()``, so
    papermill ``-p seq_len 1024`` takes effect) and keyword arguments; a capture
    setting that differs from the existing capture is an error, never mixed.
    Metrics are cached per analysis options (see :func:`load_or_analyze`).
    """
    run_dir = Path(run_dir)
    capture, analysis = run_settings(run_dir, namespace, **overrides)
    return _open_run(run_dir, _normalized(capture), analysis)


def load_or_capture(run_dir: str | os.PathLike, revision: str | None = None, **params) -> xr.Dataset:
    """Open ``RUN/capture.nc``, or capture it first (kept for notebooks written before :func:`load_run`).

    ``params`` are :class:`CaptureOptions` fields over the run's settings; other settings than the existing
    capture's are an error.
    """
    if revision is not None:
        params["revision"] = revision
    run_dir = Path(run_dir)
    options = _normalized(CaptureOptions.from_kwargs(run_settings(run_dir)[0], **params))
    with quiet_transformers():
        path = _ensure_capture(run_dir, options, AnalysisOptions(seed=options.seed))
    cap = open_capture(path)
    diff = _differences(cap.attrs, options)
    if diff:
        raise CaptureError(f"{path} was captured with other parameters ({'; '.join(diff)}); "
                           "use another run directory or delete it")
    return cap


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


@dataclass
class RunResult:
    run_dir: Path
    manifest: dict


def _default_out(capture: CaptureOptions) -> Path:
    return Path("runs") / capture.model.replace("/", "__").replace("@", "--")


def _targets(out: Path, capture: CaptureOptions, parameters: dict) -> list[tuple[Path, CaptureOptions]]:
    """Every capture the notebooks read: the run's own, the code corpus's (notebook 09) and the checkpoints'
    (notebook 10, in ``RUN/checkpoints/<owner__name--revision>`` as :func:`qkplast.results.tables.checkpoint_metrics` reads)."""
    targets = [(out, capture), (out / CODE_DIR, replace(capture, corpus=parameters.get("code_corpus", CODE_CORPUS)))]
    for ckpt in parameters.get("checkpoints") or []:
        model, _, revision = ckpt.partition("@")
        slug = ckpt.replace("/", "__").replace("@", "--")
        targets.append((out / "checkpoints" / slug, replace(capture, model=model, revision=revision or None)))
    return targets


def _capture_stage(targets, analysis: AnalysisOptions, progress: bool) -> int:
    """Every missing capture, one load per model (released before the next and before returning).

    The corpora are checked (tokenizer only) before any weights load. Returns the number of model loads.
    """
    for run_dir, options in targets:
        _check_same_capture(run_dir, options)
    missing = [(d, o) for d, o in targets if not (d / "capture.nc").exists()]
    for _, options in missing:
        _check_windows(options)
    from qkplast.capture.models import split_revision

    models = list(dict.fromkeys(split_revision(o.model, o.revision) for _, o in missing))
    for model in models:
        group = [(d, o) for d, o in missing if split_revision(o.model, o.revision) == model]
        loaded = _load(group[0][1])
        try:
            for run_dir, options in group:
                if progress:
                    print(f"[qkplast run] capture: {options.corpus}, {options.docs} windows of {options.seq_len} "
                          f"tokens -> {run_dir / 'capture.nc'}", file=sys.stderr, flush=True)
                _ensure_capture(run_dir, options, analysis, loaded=loaded, progress=progress)
        finally:
            release_model(loaded)
            del loaded
            gc.collect()
    return len(models)


def _source_digest(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()[:16]


def run(capture: CaptureOptions | None = None, out: str | os.PathLike | None = None, *,
        analysis: AnalysisOptions | None = None, parameters: dict | None = None, stage: str = "notebooks",
        overwrite: bool = False, progress: bool = True, notebooks: list[Path] | None = None,
        jobs: int = 1) -> RunResult:
    """Capture, analyse and execute every notebook for one capture setting; write a manifest.

    Parameters
    ----------
    capture : CaptureOptions, optional
        The capture settings (default: those of an existing run directory, else
        the :class:`CaptureOptions` defaults).
    out : path, optional
        Run directory (default ``runs/<model>``).
    analysis : AnalysisOptions, optional
        Analysis options of the run (default: those of an existing run directory,
        else the thesis defaults with the capture's seed).
    parameters : dict, optional
        Notebook parameters (``n_boot``, ``code_corpus``, ...), passed to every notebook.
    stage : {"capture", "analyze", "notebooks"}
        Stop after this stage.
    overwrite : bool
        Delete an existing run directory first; otherwise a rerun reuses what is
        finished (captures, analyses, notebooks whose source and parameters did
        not change) and refuses other capture or analysis settings.
    progress : bool
        Progress per document (with ETA) during the captures, per cell in the notebooks.
    notebooks : list of Path, optional
        Notebooks to execute (default: every ``notebooks/NN_*.ipynb``).
    jobs : int
        Notebooks executed at once, each in its own kernel (default 1). On a
        CPU machine 2 overlaps the single-threaded parts of one notebook
        (kernel start, imports, tables, figures) with another's work; the book
        build uses it. Keep 1 where a notebook loads a large model (chapter 12
        loads the run's model for its interventions): two kernels would hold two
        copies on the GPU.

    Raises
    ------
    RunError
        A failing notebook (naming it, the cell and the error; the manifest records
        the failure) or a run directory made with other settings.
    """
    if stage not in STAGES:
        raise RunError(f"stage must be one of {STAGES}, got {stage!r}")
    # absolute: papermill changes the process's working directory while it runs a notebook, and with jobs > 1
    # this thread writes the manifest meanwhile
    out = Path(out or _default_out(capture or CaptureOptions())).resolve()
    if out.exists() and overwrite:
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    recorded_capture, recorded_analysis = run_settings(out)
    capture = _normalized(capture or recorded_capture)
    _check_same_capture(out, capture)
    previous = _manifest(out) or {}
    analysis = analysis or (recorded_analysis if previous.get("analysis") else AnalysisOptions(seed=capture.seed))
    parameters = dict(parameters or {})
    if previous.get("analysis") and AnalysisOptions(**previous["analysis"]).result_key() != analysis.result_key():
        raise RunError(f"{out} was analysed with other options; use another run directory (--out) or --overwrite")
    manifest = {"capture": capture.to_dict(), "analysis": analysis.to_dict(), "parameters": parameters,
                "versions": _versions(), "command": sys.argv, "commit": previous.get("commit"),
                "timings_s": dict(previous.get("timings_s", {})), "notebooks": list(previous.get("notebooks", [])),
                "stage": stage, "status": "running"}
    if capture.device.startswith("cuda"):
        import torch

        manifest["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None

    targets = _targets(out, capture, parameters)
    _write_manifest(out, {**previous, **manifest})
    t0 = time.perf_counter()
    _capture_stage(targets, analysis, progress)
    manifest["timings_s"]["capture"] = round(time.perf_counter() - t0, 2)
    manifest["commit"] = open_dataset(out / "capture.nc").attrs.get("commit")
    _write_manifest(out, manifest)
    if stage == "capture":
        return _finish(out, manifest)

    from qkplast.stats.bootstrap import DEFAULT_REPLICATES

    t0 = time.perf_counter()
    for run_dir, _ in targets:
        captured = open_capture(run_dir / "capture.nc")
        load_or_analyze(run_dir, captured, **analysis.to_dict())
        if stage == "notebooks" and len(set(captured.doc.values.tolist())) >= 2:
            # the notebooks' document bootstrap (07 and 08 on the run, 09 on the code), made once here: two
            # notebooks running at once (jobs > 1) would each compute it
            load_or_bootstrap(run_dir, captured, n_boot=int(parameters.get("n_boot", DEFAULT_REPLICATES)),
                              seed=analysis.seed, **{k: v for k, v in analysis.to_dict().items() if k != "seed"})
    manifest["timings_s"]["analyze"] = round(time.perf_counter() - t0, 2)
    _write_manifest(out, manifest)
    if stage == "analyze":
        return _finish(out, manifest)

    nb_out = out / "notebooks"
    nb_out.mkdir(exist_ok=True)
    done = {e["name"]: e for e in manifest["notebooks"] if e.get("status") == "ok"}
    paths = [Path(p).resolve() for p in (notebooks or notebook_paths())]
    entries: dict[str, dict] = {}
    todo = []
    for i, path in enumerate(paths, 1):
        # each notebook gets the parameters it declares (papermill warns about the others)
        declared = _declared_parameters(path)
        nb_params = {**{k: v for k, v in parameters.items() if k in declared}, "run_dir": str(out)}
        entry = done.get(path.name)
        if entry and entry.get("source") == _source_digest(path) and entry.get("parameters") == nb_params \
                and (nb_out / path.name).exists():
            entries[path.name] = entry
        else:
            todo.append((i, path, nb_params))

    def record():
        manifest["notebooks"] = [entries[p.name] for p in paths if p.name in entries]
        _write_manifest(out, manifest)

    label = lambda i, path: f"[qkplast run] notebook {i}/{len(paths)}: {path.name}"  # noqa: E731
    if jobs > 1:  # the longest first, so that the short ones fill in beside them at the end
        todo.sort(key=lambda item: SLOW_FIRST.index(item[1].stem) if item[1].stem in SLOW_FIRST else len(SLOW_FIRST))
    with ThreadPoolExecutor(max_workers=max(1, int(jobs))) as pool:
        futures = {pool.submit(_execute_notebook, path, nb_out / path.name, nb_params, progress and jobs == 1,
                               label(i, path) if progress else None): path for i, path, nb_params in todo}
        failure = None
        for future in as_completed(futures):
            path = futures[future]
            entry = future.result()
            entries[path.name] = entry
            if entry["status"] == "ok":
                manifest["timings_s"][path.stem] = entry["seconds"]
            elif failure is None:
                failure = entry
                manifest["status"] = "failed"
                for other in futures:
                    other.cancel()  # notebooks not yet started are not run
            record()
    if failure is not None:
        raise RunError(f"notebook {failure['name']} failed in cell {failure['cell']}: {failure['error']} "
                       f"(executed copy with the traceback: {nb_out / failure['name']})")
    record()
    return _finish(out, manifest)


#: the default run's slowest notebooks, slowest first (measured: 12 ~280 s, 13 ~140 s, 07 ~80 s on 2 cores); with
#: jobs > 1 they start first and the others run beside them
SLOW_FIRST = ("12_interventions", "13_open_questions", "07_corrections")


def _execute_notebook(path: Path, target: Path, nb_params: dict, progress_bar: bool, label: str | None) -> dict:
    """Execute one notebook with papermill; its manifest entry (status, seconds or the failing cell)."""
    import papermill as pm

    if label:
        print(label, file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        pm.execute_notebook(str(path), str(target), parameters=nb_params, cwd=str(path.parent),
                            progress_bar=progress_bar, kernel_name="python3")
    except pm.PapermillExecutionError as exc:
        return {"name": path.name, "status": "failed", "cell": exc.exec_count, "error": f"{exc.ename}: {exc.evalue}"}
    seconds = round(time.perf_counter() - t0, 2)
    if label:
        print(f"{label} done in {seconds:.0f} s", file=sys.stderr, flush=True)
    return {"name": path.name, "status": "ok", "seconds": seconds, "source": _source_digest(path),
            "parameters": nb_params}


def _finish(out: Path, manifest: dict) -> RunResult:
    manifest["status"] = "ok"
    _write_manifest(out, manifest)
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
    from qkplast.results.crossrun import expand_runs  # a study file or directory stands for its runs (qkplast study)

    rows = []
    for d in expand_runs(run_dirs):
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


__all__ = ["Run", "RunError", "RunResult", "capture_file", "compare", "context_profiles", "load_or_analyze",
           "load_or_bootstrap", "load_or_capture", "load_run", "notebook_parameters", "release_model", "run",
           "run_settings", "split_parameters", "summarize"]

"""The run directory: what one run holds on disk, and how each product is reused or made.

A *run directory* holds everything one capture setting produced::

    RUN/manifest.json        capture and analysis options (CaptureOptions / AnalysisOptions, same names),
                             notebook parameters, versions, resolved commit, timings, status
    RUN/capture.nc           the capture (qkplast.capture_format contract), resumable through RUN/capture.nc.parts/
    RUN/metrics.nc           qkplast.analyze with the run's analysis options
    RUN/bootstrap.nc         the document bootstrap of the run's metrics
    RUN/null-*.nc, ...       other products a chapter computes from the capture (qkplast.rundir.derived:
                             permutation nulls, plasticity with other options, bounds, tables)
    RUN/code/                the same for the code corpus (notebook 09)
    RUN/checkpoints/SLUG/    the same for each checkpoint a notebook reads (notebook 10)
    RUN/notebooks/*.ipynb    the executed notebooks (papermill)

Every computed product goes through :func:`cached`: the run's own setting is ``RUN/STEM.nc``, any other
setting ``RUN/STEM-<hash>.nc``, and the key written into each file includes the schema version of the
code that made it, so a product made before a change in that code's output is recomputed, never reused.
Notebooks call :func:`load_run`, which reads the settings from ``RUN/manifest.json`` (the
:class:`CaptureOptions` defaults when the run is new), so the same notebook works inside ``qkplast run``
and on its own (under nbval, where the first notebook captures with the defaults).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path

import xarray as xr

from qkplast.errors import QkplastError
from qkplast.capture_format import open_capture, open_dataset, read_attrs, save_dataset
from qkplast.options import (CAPTURE_EXECUTION_OPTIONS, AnalysisOptions, CaptureOptions, UnknownOptionError,
                             parse_rope_scaling, typed_option)
from qkplast.rundir.study_file import STAGES

__all__ = ["CHECKPOINTS_DIR", "CODE_DIR", "MANIFEST", "STAGES", "Run", "RunError", "cached", "capture_differences",
           "chapter_run", "check_same_capture", "checkpoint_dir", "checkpoint_metrics", "checkpoint_slug",
           "clear_leftover_parts", "ensure_capture",
           "load_or_analyze", "load_or_bootstrap", "load_or_capture", "load_run", "open_metrics", "read_manifest",
           "run_settings", "write_manifest"]

MANIFEST = "manifest.json"
#: Sub-directory of a run that holds the code capture (notebook 09).
CODE_DIR = "code"
#: Sub-directory of a run that holds one run directory per checkpoint (notebook 10).
CHECKPOINTS_DIR = "checkpoints"

CAPTURE_FIELDS = tuple(f.name for f in fields(CaptureOptions))
ANALYSIS_FIELDS = tuple(f.name for f in fields(AnalysisOptions))


class RunError(QkplastError):
    """A run directory holds other settings or a stale or broken file; the message names which and the fix."""


# --------------------------------------------------------------------------- the manifest


def read_manifest(run_dir) -> dict | None:
    """``RUN/manifest.json`` as a dict, or None when the run has none yet."""
    path = Path(run_dir) / MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise RunError(f"{path} is not valid JSON ({exc.msg}); delete it or rerun with --overwrite") from exc


def write_manifest(run_dir, manifest: dict) -> None:
    """Write ``RUN/manifest.json`` atomically (a reader never sees half a file)."""
    path = Path(run_dir) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    os.replace(tmp, path)


def recorded_in_capture(path: Path) -> dict:
    """The CaptureOptions fields a capture file's attrs record (a capture made by ``qkplast capture --out``)."""
    if not path.exists():
        return {}
    attrs = open_dataset(path).attrs
    return {k: attrs[k] for k in CAPTURE_FIELDS if k in attrs}


def _namespace_overrides(namespace: dict | None, overrides: dict) -> tuple[dict, dict]:
    """Capture and analysis fields given by a notebook's ``globals()`` and keywords (keywords win)."""
    given = {k: v for k, v in (namespace or {}).items() if k in CAPTURE_FIELDS + ANALYSIS_FIELDS}
    given.update(overrides)
    unknown = sorted(set(overrides) - set(CAPTURE_FIELDS + ANALYSIS_FIELDS))
    if unknown:
        raise UnknownOptionError(f"unknown option(s) {unknown}: neither CaptureOptions nor AnalysisOptions fields")
    capture = {k: v for k, v in given.items() if k in CAPTURE_FIELDS}
    analysis = {k: v for k, v in given.items() if k in ANALYSIS_FIELDS}
    return capture, analysis


def run_settings(run_dir, namespace: dict | None = None, **overrides) -> tuple[CaptureOptions, AnalysisOptions]:
    """The capture and analysis options a run directory was made with (the defaults when it is new).

    ``namespace`` (a notebook's ``globals()``) and ``overrides`` replace fields by name, as in :func:`load_run`;
    the analysis seed follows a capture seed given without one of its own.
    """
    manifest = read_manifest(run_dir) or {}
    recorded = manifest.get("capture") or recorded_in_capture(Path(run_dir) / "capture.nc")
    capture = CaptureOptions(**{k: v for k, v in recorded.items() if k in CAPTURE_FIELDS})
    analysis = AnalysisOptions(**{k: v for k, v in manifest.get("analysis", {"seed": capture.seed}).items()
                                  if k in ANALYSIS_FIELDS})
    cap_over, ana_over = _namespace_overrides(namespace, overrides)
    if "seed" in cap_over:
        ana_over.setdefault("seed", cap_over["seed"])
    return replace(capture, **cap_over), replace(analysis, **ana_over)


# --------------------------------------------------------------------------- the capture


def capture_differences(recorded: dict, wanted: CaptureOptions) -> list[str]:
    """Settings that change what is captured and differ between a recorded dict and ``wanted``."""
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


def check_same_capture(run_dir: Path, wanted: CaptureOptions) -> None:
    """Refuse a run directory whose capture was made with other settings than ``wanted``."""
    recorded = (read_manifest(run_dir) or {}).get("capture") or recorded_in_capture(Path(run_dir) / "capture.nc")
    if not recorded:
        return
    diff = capture_differences(recorded, wanted)
    if diff:
        raise RunError(f"{run_dir} was made with other capture settings ({'; '.join(diff)}); "
                       "use another run directory (--out) or --overwrite")


def clear_leftover_parts(run_dir: Path) -> bool:
    """Delete ``RUN/capture.nc.parts`` when ``RUN/capture.nc`` exists; True when something was deleted.

    The capture file is written atomically before its parts are deleted, so parts beside it are redundant: a
    capture killed between the two (a timed-out job), or while deleting them, leaves them behind, and the next
    attempt finds the capture done and never captures again. Idempotent, so every attempt can call it.
    """
    leftover = Path(run_dir) / "capture.nc.parts"
    if not ((Path(run_dir) / "capture.nc").is_file() and leftover.is_dir()):
        return False
    import shutil

    shutil.rmtree(leftover)
    return True


def ensure_capture(run_dir: Path, options: CaptureOptions, analysis: AnalysisOptions, *, loaded=None,
                   progress: bool = False, plan=None) -> Path:
    """``RUN/capture.nc`` for ``options``: reused when present (refused if made otherwise), else captured.

    A first capture records its settings in the manifest, so the next reader finds them. ``plan``: the
    preflight of ``options`` (:func:`qkplast.capture.plan.preflight`) that the caller made after checking this
    directory's settings (:func:`qkplast.pipeline.stages.check_before_weights`); neither is made again.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if plan is None:
        check_same_capture(run_dir, options)
    path = run_dir / "capture.nc"
    if not path.exists():
        from qkplast.capture.driver import run_capture  # the capture stack, only when there is something to capture

        # the plan only when there is one: run_capture makes its own otherwise
        run_capture(options, path, progress=progress, loaded=loaded, **({} if plan is None else {"plan": plan}))
    clear_leftover_parts(run_dir)
    manifest = read_manifest(run_dir) or {}
    if "capture" not in manifest:
        attrs = open_dataset(path).attrs
        manifest.update(capture=options.to_dict(), analysis=analysis.to_dict(), commit=attrs.get("commit"),
                        status=manifest.get("status", "captured"))
        write_manifest(run_dir, manifest)
    return path


def _quiet_if_capturing(run_dir):
    """:func:`~qkplast.capture.models.quiet_transformers` when ``RUN/capture.nc`` is still to be made (the model
    loads), else a context that does nothing: a finished run is read without importing transformers."""
    if (Path(run_dir) / "capture.nc").exists():
        return contextlib.nullcontext()
    from qkplast.capture.models import quiet_transformers

    return quiet_transformers()


def load_or_capture(run_dir, options: CaptureOptions | None = None) -> xr.Dataset:
    """Open ``RUN/capture.nc``, or capture it first; ``options`` default to the run's recorded settings.

    Other settings than the existing capture's are an error, never mixed.
    """
    run_dir = Path(run_dir)
    options = options or run_settings(run_dir)[0]
    with _quiet_if_capturing(run_dir):
        path = ensure_capture(run_dir, options, AnalysisOptions(seed=options.seed))
    cap = open_capture(path)
    diff = capture_differences(cap.attrs, options)
    if diff:
        raise RunError(f"{path} was captured with other parameters ({'; '.join(diff)}); "
                       "use another run directory or delete it")
    return cap


def checkpoint_slug(checkpoint: str) -> str:
    """The directory name of a checkpoint ``owner/name@revision`` (or a local path): ``owner__name--revision``."""
    return checkpoint.replace("/", "__").replace("@", "--")


def checkpoint_dir(run_dir, checkpoint: str) -> Path:
    """``RUN/checkpoints/<slug>``: the run directory of one checkpoint a notebook reads."""
    return Path(run_dir) / CHECKPOINTS_DIR / checkpoint_slug(checkpoint)


def checkpoint_options(options: CaptureOptions, checkpoint: str) -> CaptureOptions:
    """``options`` with the model replaced by ``checkpoint`` (``owner/name@revision`` or a local directory)."""
    return replace(options, model=checkpoint, revision=None)


def checkpoint_metrics(checkpoints: list[str], run_dir, options: CaptureOptions) -> dict[str, xr.Dataset]:
    """Capture and analyse each checkpoint with ``options`` (model replaced) in its own run directory.

    Returns ``{checkpoint: metrics}`` in the given order; captures and metrics are reused on a second call.
    """
    out = {}
    for ckpt in checkpoints:
        directory = checkpoint_dir(run_dir, ckpt)
        cap = load_or_capture(directory, checkpoint_options(options, ckpt))
        out[ckpt] = load_or_analyze(directory, cap, AnalysisOptions(seed=options.seed))[0]
    return out


# --------------------------------------------------------------------------- computed products


def _key_text(key: dict) -> str:
    return json.dumps(key, sort_keys=True, default=str)


#: Entries of a cache key that say which code (and where) made a product, not which setting it is.
_CODE_ENTRIES = ("schema", "provenance")


def _stored_key(path: Path) -> str | None:
    """The key a product file was made with, from its header (the data is read only when the key matches)."""
    attrs = read_attrs(path)
    if attrs is None:  # not a dataset of qkplast's, or damaged: open_dataset says which, as before
        attrs = open_dataset(path).attrs
    return attrs.get("cache_key")


def _same_but_code(stored: str | None, key: dict) -> bool:
    """Whether a stored key is the same setting made by other code (another schema or provenance, or code before
    cache keys existed): such a file is recomputed in place, not kept beside the new one."""
    if stored is None:
        return True
    try:
        old = json.loads(stored)
    except json.JSONDecodeError:
        return True
    if not isinstance(old, dict):
        return True
    return {k: v for k, v in old.items() if k not in _CODE_ENTRIES} == json.loads(_key_text(
        {k: v for k, v in key.items() if k not in _CODE_ENTRIES}))


#: Products read in this process, by path: ``(stat signature, dataset)``, the newest last (see :func:`_read`).
_READ: dict = {}
#: How many products :func:`_read` keeps, and the largest it keeps (bytes of data).
_READ_KEEP, _READ_MAX_BYTES = 16, 64 * 2**20


def _read(path: Path) -> xr.Dataset:
    """``open_dataset(path)``, or a shallow copy of this process's last read of the same unchanged file.

    A chapter opens one product more than once (the run's metrics in :func:`load_run`, then for its own options in
    :func:`load_or_analyze`); opening a netCDF file of 70 variables takes half a second. The copy has its own
    attrs and variables, its arrays are shared (products are read, not written in place).
    """
    path = path.resolve()
    st = path.stat()
    signature = (st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _READ.get(path)
    if hit is not None and hit[0] == signature:
        return hit[1].copy()
    ds = open_dataset(path)
    _READ.pop(path, None)
    if ds.nbytes <= _READ_MAX_BYTES:
        _READ[path] = (signature, ds)
        while len(_READ) > _READ_KEEP:
            _READ.pop(next(iter(_READ)))
    return ds.copy()


def cached(run_dir, stem: str, key: dict, compute) -> xr.Dataset:
    """A product of the run directory: reused when it was made with ``key``, else ``compute()`` saved.

    The first setting of a product takes ``RUN/STEM.nc``; another setting ``RUN/STEM-<hash of key>.nc``
    and never overwrites it. ``key`` should hold a ``schema`` entry, the version of the output of the code
    that computes the product, and may hold a ``provenance`` entry (:func:`qkplast.provenance.product_provenance`):
    a file made with the same setting by other code (another schema or provenance, or no key at all) is
    recomputed in place, never reused stale. A file's key is read from its header, and its data only when the key
    matches (through :func:`_read`, once per process while the file is unchanged).

    Parameters
    ----------
    run_dir : path
        The run directory (created if missing).
    stem : str
        File stem (``metrics``, ``bootstrap``, ``interventions``, ...).
    key : dict
        Everything the product depends on, JSON-serialisable (written into the file's ``cache_key`` attr).
    compute : callable
        Makes the product (an :class:`xarray.Dataset`) when no file matches.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    text = _key_text(key)
    main = run_dir / f"{stem}.nc"
    other = run_dir / f"{stem}-{hashlib.sha1(text.encode()).hexdigest()[:10]}.nc"
    stored = {}
    for path in (main, other):
        if path.exists():
            stored[path] = _stored_key(path)
            if stored[path] == text:
                return _read(path)
    target = main if not main.exists() or _same_but_code(stored.get(main), key) else other
    ds = compute()
    ds.attrs["cache_key"] = text
    save_dataset(ds, target, overwrite=True)
    return ds


def product_store(run_dir):
    """:func:`cached` bound to a run directory: ``store(stem, key, compute) -> xarray.Dataset``.

    The functions below the run directory's layer (:mod:`qkplast.stats`, :mod:`qkplast.analysis`) cannot import
    it; they take a ``store`` argument instead, and a notebook passes this one, so their products are kept in the
    run directory and read back. A ``stem`` may name a sub-folder (``"conditions/reseed-null"``), created when
    missing.
    """
    run_dir = Path(run_dir)

    def store(stem: str, key: dict, compute) -> xr.Dataset:
        path = run_dir / stem
        return cached(path.parent, path.name, key, compute)

    return store


def _analysis_key(options: AnalysisOptions) -> dict:
    from qkplast.analysis.schema import SCHEMA_VERSION

    return {"schema": SCHEMA_VERSION, "options": options.result_key()}


def load_or_analyze(run_dir, capture: xr.Dataset, options: AnalysisOptions | None = None
                    ) -> tuple[xr.Dataset, list[str]]:
    """The run's metrics for ``options`` (the thesis defaults when None): reused, else analysed and saved.

    Returns the metrics and the analysis warnings as text (the notebooks print them, so they appear in
    the output without machine-specific file paths).
    """
    options = options or AnalysisOptions()

    def compute():
        from qkplast.analysis.metrics import analyze  # here: reusing the cached metrics imports no torch

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            metrics = analyze(capture, options)
        metrics.attrs["warnings"] = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        return metrics

    metrics = cached(run_dir, "metrics", _analysis_key(options), compute)
    return metrics, list(metrics.attrs.get("warnings", []))


def load_or_bootstrap(run_dir, capture: xr.Dataset, options: AnalysisOptions | None = None,
                      n_boot: int = 1000) -> xr.Dataset:
    """The run's document bootstrap (``n_boot`` replicates, seeded by ``options.seed``): reused, else made and saved."""
    from qkplast.stats.schema import SCHEMA_VERSION, supports

    options = options or AnalysisOptions()
    analysis = _analysis_key(options)
    key = {"schema": [analysis["schema"], SCHEMA_VERSION], "options": analysis["options"], "n_boot": n_boot,
           "computation": "reweight" if supports(options) else "exact"}

    def compute():
        from qkplast.stats.bootstrap import bootstrap  # here: reusing the cached bootstrap imports no torch or scipy

        return bootstrap(capture, n_boot=n_boot, seed=options.seed, options=options)

    return cached(run_dir, "bootstrap", key, compute)


def open_metrics(run_dir) -> xr.Dataset:
    """``RUN/metrics.nc`` for a reader of finished runs (cross-run tables), refused when older code made it."""
    from qkplast.analysis.schema import SCHEMA_VERSION

    path = Path(run_dir) / "metrics.nc"
    if not path.exists():
        raise RunError(f"{run_dir} has no metrics.nc; analyse it first (qkplast run --out {run_dir} --stage analyze)")
    metrics = _read(path)  # once per process while the file is unchanged: a study's tables read each run's often
    schema = metrics.attrs.get("schema_version")  # written by analyze()
    if schema != SCHEMA_VERSION:
        raise RunError(f"{path} was made by an older qkplast (metrics schema {schema}, now {SCHEMA_VERSION}); "
                       f"rerun `qkplast run --out {run_dir} --stage analyze` to recompute it")
    return metrics


# --------------------------------------------------------------------------- what notebooks call


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
        return load_or_bootstrap(self.dir, self.capture, self.analysis, n_boot)

    def on_corpus(self, corpus: str, subdir: str = CODE_DIR) -> "Run":
        """The same capture and analysis settings on another corpus, in ``RUN/<subdir>``."""
        return _open_run(self.dir / subdir, replace(self.options, corpus=corpus), self.analysis)

    def code(self, corpus: str) -> tuple["Run | None", str]:
        """The run's capture of a second corpus (notebook 09's code) as ``qkplast run`` sized it, and a note.

        ``qkplast run`` records in the manifest how the code capture was sized to what ``corpus`` yields
        (:func:`qkplast.capture.plan.size_code_capture`) or why it was left out; a run made otherwise is sized
        here (tokenizer only) and captured on first use. Returns ``(None, note)`` when there is no code capture.
        """
        from qkplast.capture.plan import CodeCapture

        manifest = read_manifest(self.dir) or {}
        record = manifest.get("code") or {}
        if record.get("corpus") == corpus:
            sized = CodeCapture.from_dict(record)
            if record["status"] == "failed":
                return None, record["note"]
        else:
            from qkplast.capture.models import quiet_transformers
            from qkplast.capture.plan import size_code_capture

            with quiet_transformers():  # the code corpus is sized with the model's tokenizer
                sized = size_code_capture(self.options, corpus)
            manifest["code"] = {"corpus": corpus, "main": self.options.result_key(), **sized.to_dict()}
            write_manifest(self.dir, manifest)
        if sized.options is None:
            return None, sized.note
        return _open_run(self.dir / CODE_DIR, sized.options, self.analysis), sized.note

    def header(self) -> str:
        """One line naming what the run holds: heads, model, windows, tokens and corpus."""
        attrs = self.capture.attrs
        return (f"{self.metrics.sizes['head']} heads of {attrs['model']}, {attrs['n_docs']} windows of "
                f"{attrs['seq_len']} tokens of {attrs['corpus']}")


def _open_run(run_dir: Path, options: CaptureOptions, analysis: AnalysisOptions) -> Run:
    with _quiet_if_capturing(run_dir):
        path = ensure_capture(run_dir, options, analysis)
    capture = open_capture(path)
    metrics, notes = load_or_analyze(run_dir, capture, analysis)
    return Run(Path(run_dir), options, analysis, capture, metrics, notes)


def chapter_run(run_dir, namespace: dict | None = None, **overrides) -> Run:
    """A notebook's opening call: :func:`load_run`, then one line saying what the run holds and its notes.

    Every chapter that reads the run starts with it, so the settings come from the same place (the run's
    manifest, the notebook's parameters in ``namespace``) and the page says what it shows.
    """
    run = load_run(run_dir, namespace, **overrides)
    print(run.header())
    for note in run.notes:
        print("note:", note)
    return run


def load_run(run_dir, namespace: dict | None = None, **overrides) -> Run:
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
    capture, analysis = run_settings(run_dir, namespace, **overrides)
    return _open_run(Path(run_dir), capture, analysis)
